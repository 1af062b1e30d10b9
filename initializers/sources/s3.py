"""s3:// — any S3-compatible store, listed with botocore, fetched over the shared HTTP transport.

botocore does what it is good at: the credential chain (env, profiles, web identity / IRSA, STS
role assumption with refresh), region discovery, endpoint and addressing rules, paginated
listing. It is used without boto3's layer on top, which added ~60 ms of imports and client
set-up to every run (measured). Bytes travel as ranged GETs through
:mod:`initializers.transport`, which streams at loopback speed where botocore's own body
handling is CPU-bound, signed in the headers by :mod:`initializers.sources.s3sign`.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Self
from urllib.parse import SplitResult, quote, urlsplit

import botocore.exceptions as bexc
import botocore.session
from botocore import UNSIGNED
from botocore.config import Config
from botocore.credentials import (
    AssumeRoleCredentialFetcher,
    DeferredRefreshableCredentials,
)
from botocore.parsers import ResponseParserFactory

from initializers import checksum as checksums
from initializers.config import Settings
from initializers.errors import AuthError, NotFoundError, TransientError, UsageError
from initializers.retry import RetryPolicy
from initializers.sources.base import Checksum, Listing, RemoteFile, Source
from initializers.sources.prefix import Entry, list_prefix, split_location
from initializers.sources.s3sign import S3HeaderSigner
from initializers.streams import RangeReader
from initializers.transport import HttpTransport

log = logging.getLogger(__name__)

_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.\-_]{1,253}[a-z0-9]$")
_MD5_ETAG = re.compile(r"^[0-9a-f]{32}$")
# "-N" ends what was computed over an upload's N parts: a multipart ETag ("<md5 of the parts'
# md5s>-N") and a composite checksum ("<base64 of the parts' checksums>-N").
_PARTS_SUFFIX = re.compile(r"-\d+$")
# S3 "additional checksums", in order of preference (full-object CRCs are cheapest to verify).
_ADDITIONAL = (
    ("CRC64NVME", "s3-crc64nvme"),
    ("CRC32C", "s3-crc32c"),
    ("CRC32", "s3-crc32"),
    ("SHA256", "s3-sha256"),
    ("SHA1", "s3-sha1"),
)
_AUTH_CODES = {
    "AccessDenied",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "InvalidToken",
    "TokenRefreshRequired",
    "AllAccessDisabled",
    "403",
    "401",
}
_TRANSIENT_CODES = {
    "SlowDown",
    "InternalError",
    "ServiceUnavailable",
    "RequestTimeout",
    "Throttling",
    "ThrottlingException",
    "RequestTimeTooSkewed",
    "500",
    "502",
    "503",
    "504",
}


@dataclass(frozen=True)
class S3Location:
    bucket: str
    prefix: str  # "" for the whole bucket; ends with "/" when the URI named a folder

    @classmethod
    def parse(cls, location: str) -> S3Location:
        rule = "3-255 lowercase letters, digits, '.', '-'"
        bucket, prefix = split_location("s3", location, _BUCKET, rule)
        if prefix.startswith("/"):
            raise UsageError(f"s3://{location}: the key starts with '/'; remove the extra slash")
        return cls(bucket, prefix)


class S3Source(Source):
    """Objects under ``s3://bucket/prefix`` (on a ``/`` boundary), or one object."""

    def __init__(
        self, location: S3Location, settings: Settings, retry: RetryPolicy | None = None
    ) -> None:
        self.location = location
        self.settings = settings
        self.retry = retry or RetryPolicy(attempts=settings.retries)
        self._session = _make_session(settings)
        self._client = self._make_client(self._region())
        self._transport = HttpTransport(
            workers=settings.workers, timeout=settings.timeout, ca_bundle=settings.ca_bundle
        )
        credentials = None if settings.anonymous else self._resolve_credentials()
        self._signer = (
            S3HeaderSigner(credentials, self._client.meta.region_name) if credentials else None
        )
        bucket_url = urlsplit(self._call(self._bucket_url))
        self._origin = f"{bucket_url.scheme}://{bucket_url.netloc}"
        self._host = _host_header(bucket_url)
        self._bucket_path = bucket_url.path
        self._with_additional: set[str] = set()  # keys listed with an additional checksum
        self._listed_composite: set[str] = set()  # keys listed with a checksum of their parts

    @classmethod
    def from_settings(cls, location: str, settings: Settings) -> Self:
        return cls(S3Location.parse(location), settings)

    def describe(self) -> str:
        return f"s3://{self.location.bucket}/{self.location.prefix}"

    # -- clients and credentials ---------------------------------------------------------------

    def _config(self, region: str) -> Config:
        return Config(
            region_name=region,
            signature_version=UNSIGNED if self.settings.anonymous else "s3v4",
            s3={"addressing_style": "path" if self.settings.endpoint else "auto"},
            retries={"total_max_attempts": 1, "mode": "standard"},  # our RetryPolicy retries
            connect_timeout=min(10.0, self.settings.timeout),
            read_timeout=self.settings.timeout,
            max_pool_connections=self.settings.workers,
        )

    def _make_client(self, region: str) -> Any:
        try:
            return self._session.create_client(
                "s3",
                endpoint_url=self.settings.endpoint,
                config=self._config(region),
                verify=self.settings.ca_bundle,
            )
        except ValueError as exc:  # malformed endpoint URL
            raise UsageError(f"invalid S3 endpoint {self.settings.endpoint!r}: {exc}") from None

    def _region(self) -> str:
        """The signing region: 'auto' asks AWS where the bucket lives; custom endpoints get
        us-east-1, which MinIO, Ceph and R2 accept."""
        region = self.settings.region
        if region != "auto":
            return region
        if self.settings.endpoint:
            return "us-east-1"  # MinIO, Ceph, R2 ... accept it for SigV4
        probe = self._make_client("us-east-1")
        try:
            response = self._call(lambda: probe.head_bucket(Bucket=self.location.bucket))
            found = response["ResponseMetadata"]["HTTPHeaders"].get("x-amz-bucket-region")
        except (AuthError, NotFoundError) as exc:
            found = getattr(exc, "bucket_region", None)
            if not found:
                raise
        log.debug("bucket %s is in %s", self.location.bucket, found)
        return found or "us-east-1"

    def _resolve_credentials(self) -> Any:
        credentials = self._session.get_credentials()
        if credentials is None:
            raise AuthError(
                "no S3 credentials found: set ACCESS_KEY_ID and SECRET_ACCESS_KEY, "
                "AWS_PROFILE, or a web identity (IRSA); use --anonymous for a "
                "public bucket"
            )
        # Surfaces STS / role errors now rather than at the first GET.
        self.retry.call(lambda: self._call(credentials.get_frozen_credentials), "credentials")
        return credentials

    def _bucket_url(self) -> str:
        """Base URL of the bucket (virtual-hosted or path-style, as botocore decides)."""
        url = self._client.generate_presigned_url(
            "get_object", Params={"Bucket": self.location.bucket, "Key": "k"}, ExpiresIn=60
        )
        return url.split("?", 1)[0][: -len("k")]

    # -- listing --------------------------------------------------------------------------------

    def list(self) -> Listing:
        return list_prefix(
            self.location.prefix,
            where=self.describe(),
            retry=self.retry,
            list_folder=self._list_objects,
            lookup=self._head_entry,
            remote=lambda path, entry: self._remote(path, entry.key, entry.meta),
        )

    def _list_objects(self, folder: str) -> list[Entry]:
        paginator = self._client.get_paginator("list_objects_v2")
        objects: list[dict[str, Any]] = []
        for page in self._call(
            lambda: list(paginator.paginate(Bucket=self.location.bucket, Prefix=folder))
        ):
            objects.extend(page.get("Contents", []))
        # Listings name a checksum's algorithm, not its value: a HEAD may find the value later,
        # unless the listing already says it is a composite of the parts (which verifies nothing).
        self._listed_composite = {o["Key"] for o in objects if o.get("ChecksumType") == "COMPOSITE"}
        self._with_additional = {
            o["Key"]
            for o in objects
            if o.get("ChecksumAlgorithm") and o["Key"] not in self._listed_composite
        }
        return [Entry(o["Key"], int(o.get("Size", 0)), o) for o in objects]

    def _head_entry(self, key: str) -> Entry | None:
        found = self._head_once(key)
        return Entry(key, int(found.get("ContentLength", 0)), found) if found is not None else None

    def _head_object(self, key: str) -> dict[str, Any] | None:
        return self.retry.call(lambda: self._head_once(key), key)

    def check_access(self, file: RemoteFile) -> None:
        """A HEAD: S3 authorizes it with s3:GetObject, exactly as a GET, and sends no body."""
        if self._head_once(file.locator) is None:
            raise NotFoundError(f"s3://{self.location.bucket}/{file.locator}: deleted since listed")

    def _head_once(self, key: str) -> dict[str, Any] | None:
        try:
            return self._call(
                lambda: self._client.head_object(
                    Bucket=self.location.bucket, Key=key, ChecksumMode="ENABLED"
                )
            )
        except NotFoundError:
            return None

    def _remote(self, path: str, key: str, obj: Mapping[str, Any]) -> RemoteFile:
        etag = str(obj.get("ETag", "")).strip('"')
        checksum = Checksum("md5", etag) if _MD5_ETAG.match(etag) else None
        additional = full_object_checksum(obj)
        return RemoteFile(
            path=path,
            size=int(obj.get("Size", obj.get("ContentLength", 0))),
            version=etag or None,
            checksum=additional or checksum,
            locator=key,
        )

    # -- fetching -------------------------------------------------------------------------------

    def open_range(self, file: RemoteFile, start: int, end: int) -> RangeReader:
        whole = start == 0 and end == file.size
        path = self._bucket_path + quote(file.locator, safe="/~")
        # A whole-object GET can carry the object's additional checksum in its headers.
        signed = {"x-amz-checksum-mode": "ENABLED"} if whole else {}
        if self._signer is not None:
            signed = self._signer.sign(self._host, path, signed)
        headers = {**signed, "If-Match": f'"{file.version}"'} if file.version else signed
        return self._transport.open_range(
            self._origin + path, headers, start, end, file.path, whole=whole
        )

    def checksum_for(self, file: RemoteFile, headers: Mapping[str, str]) -> Checksum | None:
        """Prefer the object's additional checksum (from the GET, else one HEAD), then the
        ETag's MD5 — except with SSE-KMS or SSE-C, where the ETag is not the content's MD5."""
        # Only a whole-object response's checksum headers describe the object: what a server
        # attaches to a ranged one (rclone: the object's; others: perhaps the range's) is unsure.
        ranged = bool(headers.get("Content-Range"))
        found = None if ranged else full_object_checksum(_checksum_headers(headers))
        # One HEAD per file fetched in ranges (large files: its cost is nothing beside theirs),
        # or listed with an algorithm; never for what the listing called a composite.
        if (
            found is None
            and file.locator not in self._listed_composite
            and (ranged or file.locator in self._with_additional)
        ):
            head = self._head_object(file.locator)
            found = full_object_checksum(head) if head else None
        if found is not None:
            return found
        sse = headers.get("x-amz-server-side-encryption", "")
        if (
            sse.startswith("aws:kms")
            or "x-amz-server-side-encryption-customer-algorithm" in headers
        ):
            return None
        return file.checksum

    def close(self) -> None:
        self._transport.close()
        self._client.close()  # botocore opens a new pool if the client is used again

    # -- errors ---------------------------------------------------------------------------------

    def _call(self, fn: Any) -> Any:
        """Run a botocore call, mapping its failures to typed errors."""
        where = self.describe()
        try:
            return fn()
        except bexc.NoCredentialsError:
            raise AuthError(
                "no S3 credentials found: set ACCESS_KEY_ID and SECRET_ACCESS_KEY, "
                "AWS_PROFILE, or a web identity (IRSA); use --anonymous for a public "
                "bucket"
            ) from None
        except bexc.SSLError:
            raise UsageError(
                f"{where}: TLS verification failed; pass --ca-bundle (or "
                "AWS_CA_BUNDLE) with the endpoint's CA"
            ) from None
        except (bexc.ConnectionError, bexc.HTTPClientError, bexc.ResponseStreamingError) as exc:
            raise TransientError(
                f"{where}: cannot reach the S3 endpoint ({type(exc).__name__})"
            ) from None
        except bexc.ClientError as exc:
            raise _client_error(exc, where, self.location.bucket) from None
        except bexc.BotoCoreError as exc:  # configuration problems: region, endpoint, profile
            raise UsageError(f"{where}: {exc}") from None


def _make_session(settings: Settings) -> botocore.session.Session:
    """A session with the configured keys (or the default chain), assuming ROLE_ARN if set.

    The assumed role's credentials refresh themselves before they expire, so a fetch longer
    than the role's session duration keeps working.
    """
    # STS needs a region even when S3's is discovered later; its global endpoint is us-east-1.
    region = "us-east-1" if settings.region == "auto" else settings.region
    session = _session(region)
    if settings.access_key_id or settings.secret_access_key or settings.session_token:
        session.set_credentials(
            settings.access_key_id, settings.secret_access_key, settings.session_token
        )
    if not settings.role_arn:
        return session
    source_credentials = session.get_credentials()
    if source_credentials is None:
        raise AuthError(
            "ROLE_ARN is set but there are no credentials to assume it with; set "
            "ACCESS_KEY_ID/SECRET_ACCESS_KEY or a web identity (IRSA)"
        )
    fetcher = AssumeRoleCredentialFetcher(
        client_creator=session.create_client,
        source_credentials=source_credentials,
        role_arn=settings.role_arn,
        extra_args={"RoleSessionName": "kubeflow-initializer"},
    )
    assumed = _session(region)
    assumed._credentials = DeferredRefreshableCredentials(
        method="assume-role", refresh_using=fetcher.fetch_credentials
    )
    return assumed


def _session(region: str) -> botocore.session.Session:
    session = botocore.session.get_session()
    session.set_config_variable("region", region)
    _skip_timestamp_parsing(session)
    return session


def _skip_timestamp_parsing(session: botocore.session.Session) -> None:
    """Leave timestamps as the strings S3 sent: nothing here reads LastModified, and dateutil
    parsing it took ~0.1 ms an object — 0.2 s of CPU on a 2,000-file listing. botocore's
    credential fetchers accept string expiry times (they cache them as strings)."""
    factory = ResponseParserFactory()
    factory.set_parser_defaults(timestamp_parser=str)
    session.register_component("response_parser_factory", factory)


def _client_error(exc: bexc.ClientError, where: str, bucket: str) -> Exception:
    error = exc.response.get("Error", {})
    code = str(error.get("Code", ""))
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
    headers = exc.response.get("ResponseMetadata", {}).get("HTTPHeaders", {})
    if code in _TRANSIENT_CODES or status in (429, 500, 502, 503, 504):
        return TransientError(f"{where}: S3 said {code or status}")
    if code in ("NoSuchBucket",):
        return NotFoundError(
            f"{where}: bucket {bucket!r} does not exist — check its name and the endpoint/region"
        )
    if code in ("NoSuchKey", "404", "NotFound"):
        failure = NotFoundError(f"{where}: no such object")
    elif code in _AUTH_CODES or status in (401, 403):
        failure = AuthError(
            f"{where}: access denied ({code or status}); check the credentials "
            "(ACCESS_KEY_ID / SECRET_ACCESS_KEY, ROLE_ARN) and the bucket policy"
        )
    elif code in ("PermanentRedirect", "301", "AuthorizationHeaderMalformed"):
        failure = UsageError(
            f"{where}: the bucket is in another region "
            f"({headers.get('x-amz-bucket-region', 'unknown')}); set --region "
            "or leave it at 'auto'"
        )
    else:
        return UsageError(f"{where}: S3 refused the request ({code or status})")
    failure.bucket_region = headers.get("x-amz-bucket-region")  # type: ignore[attr-defined]
    return failure


def _host_header(url: SplitResult) -> str:
    """The Host header an HTTP client sends for ``url`` (no port when it is the default)."""
    host = url.hostname or ""
    host = f"[{host}]" if ":" in host else host
    default = {"http": 80, "https": 443}.get(url.scheme)
    return host if url.port in (None, default) else f"{host}:{url.port}"


def _checksum_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """A GET's response headers in botocore's HeadObject keys: ``x-amz-checksum-crc32: v`` →
    ``{"ChecksumCRC32": v}``, plus ``ChecksumType`` and ``ETag``."""
    found = {}
    for field, _ in _ADDITIONAL:
        value = headers.get(f"x-amz-checksum-{field.lower()}")
        if value:
            found[f"Checksum{field}"] = value
    for key, header in (("ChecksumType", "x-amz-checksum-type"), ("ETag", "etag")):
        if headers.get(header):
            found[key] = headers[header]
    return found


def full_object_checksum(obj: Mapping[str, Any]) -> Checksum | None:
    """The preferred checksum of ``obj`` (HeadObject's keys) that covers the whole object, or
    None when no value is sure to.

    S3-compatible servers disagree on how they mark a checksum of an upload's parts (moto's HEAD
    drops both the ``-N`` and the type that its GET sends), so a value counts only when the server
    says ``FULL_OBJECT``, or when the object is single-part (an ETag without ``-N``) and the value
    has no ``-N`` either. Anything ambiguous falls back to what can be verified for sure.
    """
    kind = str(obj.get("ChecksumType") or "").upper()
    if kind == "COMPOSITE":
        return None
    etag = str(obj.get("ETag") or "").strip('"')
    single_part = bool(etag) and not _PARTS_SUFFIX.search(etag)
    if kind != "FULL_OBJECT" and not single_part:
        return None
    for field, algorithm in _ADDITIONAL:
        value = str(obj.get(f"Checksum{field}") or "")
        if value and not _PARTS_SUFFIX.search(value) and checksums.is_supported(algorithm):
            return Checksum(algorithm, value)
    return None

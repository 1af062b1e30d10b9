"""S3's control plane through botocore: the whole AWS credential chain and AWS's endpoint rules.

botocore does what it is good at: the credential chain (env, profiles, web identity / IRSA, STS
role assumption with refresh), region discovery, endpoint and addressing rules, paginated
listing. It is used without boto3's layer on top, which added ~60 ms of imports and client
set-up to every run (measured). Its import and client set-up still cost ~0.4 s here, which is why
:mod:`initializers.sources.s3rest` serves the runs that need none of this.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from functools import partial
from typing import Any

import botocore.exceptions as bexc
import botocore.session
from botocore import UNSIGNED
from botocore.config import Config
from botocore.credentials import (
    AssumeRoleCredentialFetcher,
    DeferredRefreshableCredentials,
)
from botocore.parsers import ResponseParserFactory

from initializers.errors import AuthError, NotFoundError, TransientError, UsageError, tls_refused
from initializers.options import SourceSettings
from initializers.retry import RetryPolicy
from initializers.sources.paging import PAGE_END, PageEnd, split_pages
from initializers.sources.s3errors import s3_error
from initializers.sources.s3options import request_headers
from initializers.sources.s3pages import KeyRow, rows_of

log = logging.getLogger(__name__)


class BotocorePlane:
    """Listing, HEAD, credentials, region and the bucket's URL, from a botocore client."""

    def __init__(
        self,
        bucket: str,
        where: str,
        settings: SourceSettings,
        retry: RetryPolicy,
        version_id: str | None = None,
    ) -> None:
        """``version_id``: every HEAD asks for that version of its object (the run fetches
        one object, pinned by ``?versionId=``)."""
        self.bucket = bucket
        self._pinned = {"VersionId": version_id} if version_id else {}
        self.where = where
        self.settings = settings
        self.retry = retry
        self._session = _make_session(settings)
        self._client = self._make_client(self._discover_region())
        self.region: str = self._client.meta.region_name
        self.credentials = None if settings.anonymous else self._resolve_credentials()
        self.bucket_url: str = self._call(self._bucket_url)

    def list_objects(
        self, folder: str, start_after: str = ""
    ) -> Iterator[dict[str, Any] | PageEnd]:
        paginator = self._client.get_paginator("list_objects_v2")
        after = {"StartAfter": start_after} if start_after else {}
        pages = iter(paginator.paginate(Bucket=self.bucket, Prefix=folder, **after))
        while (page := self._call(lambda: next(pages, None))) is not None:
            yield from page.get("Contents", [])
            if page.get("IsTruncated") and page.get("NextContinuationToken"):
                yield PAGE_END

    def list_keys(self, folder: str, start_after: str = "") -> Iterator[list[KeyRow]]:
        """The same listing a page at a time, each object as a bare :data:`KeyRow` row."""
        for page in split_pages(self.list_objects(folder, start_after)):
            yield rows_of(page, folder)

    def head_object(self, key: str) -> dict[str, Any] | None:
        try:
            return self._call(
                lambda: self._client.head_object(
                    Bucket=self.bucket, Key=key, ChecksumMode="ENABLED", **self._pinned
                )
            )
        except NotFoundError:
            return None

    def head_part(self, key: str, number: int) -> dict[str, Any] | None:
        """HeadObject of part ``number``: the part's ContentLength and the object's PartsCount,
        or None where the server knows no such object or part."""
        try:
            return self._call(
                lambda: self._client.head_object(
                    Bucket=self.bucket, Key=key, PartNumber=number, **self._pinned
                )
            )
        except (NotFoundError, UsageError):
            return None

    def close(self) -> None:
        self._client.close()  # botocore opens a new pool if the client is used again

    # -- set-up ---------------------------------------------------------------------------------

    def _config(self, region: str) -> Config:
        return Config(
            region_name=region,
            signature_version=UNSIGNED if self.settings.anonymous else "s3v4",
            s3={"addressing_style": self._addressing_style()},
            retries={"total_max_attempts": 1, "mode": "standard"},  # our RetryPolicy retries
            connect_timeout=min(10.0, self.settings.timeout),
            read_timeout=self.settings.timeout,
            max_pool_connections=self.settings.workers,
        )

    def _addressing_style(self) -> str:
        """The option's; else the AWS config file's (the profile's ``s3.addressing_style``);
        else path-style on a custom endpoint (what MinIO, Ceph and R2 serve) and AWS's
        choice on AWS."""
        if self.settings.addressing_style:
            return str(self.settings.addressing_style)
        configured = (self._session.get_scoped_config().get("s3") or {}).get("addressing_style")
        if configured in ("path", "virtual", "auto"):
            return str(configured)
        return "path" if self.settings.endpoint else "auto"

    def _make_client(self, region: str) -> Any:
        try:
            client = self._session.create_client(
                "s3",
                endpoint_url=self.settings.endpoint,
                config=self._config(region),
                verify=self.settings.ca_bundle,
            )
        except ValueError as exc:  # malformed endpoint URL
            raise UsageError(f"invalid S3 endpoint {self.settings.endpoint!r}: {exc}") from None
        # On every request, signed: who pays (HeadBucket's too, whose API takes no RequestPayer),
        # and on HEADs the SSE-C key.
        extra = {reads: request_headers(self.settings, reads) for reads in (False, True)}
        client.meta.events.register("before-sign.s3", partial(_add_headers, extra))
        return client

    def _discover_region(self) -> str:
        """The signing region: 'auto' asks AWS where the bucket lives; custom endpoints get
        us-east-1, which MinIO, Ceph and R2 accept."""
        region = self.settings.region
        if region != "auto":
            return region
        if self.settings.endpoint:
            return "us-east-1"  # MinIO, Ceph, R2 ... accept it for SigV4
        probe = self._make_client("us-east-1")
        try:
            response = self._call(lambda: probe.head_bucket(Bucket=self.bucket))
            found = response["ResponseMetadata"]["HTTPHeaders"].get("x-amz-bucket-region")
        except (AuthError, NotFoundError) as exc:
            found = getattr(exc, "bucket_region", None)
            if not found:
                raise
        log.debug("bucket %s is in %s", self.bucket, found)
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
            "get_object", Params={"Bucket": self.bucket, "Key": "k"}, ExpiresIn=60
        )
        return url.split("?", 1)[0][: -len("k")]

    # -- errors ---------------------------------------------------------------------------------

    def _call(self, fn: Any) -> Any:
        """Run a botocore call, mapping its failures to typed errors."""
        where = self.where
        try:
            return fn()
        except bexc.NoCredentialsError:
            raise AuthError(
                "no S3 credentials found: set ACCESS_KEY_ID and SECRET_ACCESS_KEY, "
                "AWS_PROFILE, or a web identity (IRSA); use --anonymous for a public "
                "bucket"
            ) from None
        except bexc.SSLError:
            raise UsageError(tls_refused(where, "AWS_CA_BUNDLE")) from None
        except (bexc.ConnectionError, bexc.HTTPClientError, bexc.ResponseStreamingError) as exc:
            raise TransientError(
                f"{where}: cannot reach the S3 endpoint ({type(exc).__name__})"
            ) from None
        except bexc.ClientError as exc:
            response = exc.response
            meta = response.get("ResponseMetadata", {})
            raise s3_error(
                str(response.get("Error", {}).get("Code", "")),
                meta.get("HTTPStatusCode", 0),
                meta.get("HTTPHeaders", {}),
                where,
                self.bucket,
            ) from None
        except bexc.BotoCoreError as exc:  # configuration problems: region, endpoint, profile
            raise UsageError(f"{where}: {exc}") from None


def _make_session(settings: SourceSettings) -> botocore.session.Session:
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


def _add_headers(
    extra: dict[bool, dict[str, str]], request: Any, operation_name: str = "", **_: Any
) -> None:
    """``extra[reads an object]``: the headers S3's options add (who pays, the SSE-C key)."""
    for name, value in extra[operation_name in ("HeadObject", "GetObject")].items():
        request.headers[name] = value

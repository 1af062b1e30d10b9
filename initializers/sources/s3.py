"""s3:// — any S3-compatible store: listed by a control plane, fetched over the shared transport.

The control plane (listing, HEAD, credentials, region, the bucket's URL) is botocore's
(:mod:`initializers.sources.s3botocore`: the AWS credential chain, region discovery, AWS's
endpoint rules), except where the settings need none of that — an endpoint with static keys or
none — and two signed REST calls do (:mod:`initializers.sources.s3rest`), without the ~0.4 s of
botocore's import and client set-up. Bytes travel as ranged GETs through
:mod:`initializers.transport`, which streams at loopback speed where botocore's own body
handling is CPU-bound, signed in the headers by :mod:`initializers.sources.s3sign`.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Protocol, Self
from urllib.parse import quote, unquote, urlsplit

from initializers import checksum as checksums
from initializers.errors import NotFoundError, UsageError
from initializers.native import NativeHttp, Streamed, read_roots
from initializers.options import SourceSettings
from initializers.sources import s3rest
from initializers.sources.base import Checksum, Listed, Listing, RemoteFile, Source
from initializers.sources.paging import PAGE_END, PageEnd
from initializers.sources.prefix import (
    Entry,
    folder_of,
    list_prefix,
    one_object,
    split_location,
)
from initializers.sources.s3errors import host_header
from initializers.sources.s3options import request_headers
from initializers.sources.s3pages import KeyRow, version_of
from initializers.sources.s3sign import S3HeaderSigner
from initializers.streams import RangeReader
from initializers.transport import HttpTransport

log = logging.getLogger(__name__)

_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.\-_]{1,253}[a-z0-9]$")
_VERSION_ID = re.compile(r"\?versionId=([^&?]+)$")
_MD5_ETAG = re.compile(r"^[0-9a-f]{32}$")
# "-N" ends what was computed over an upload's N parts: a multipart ETag ("<md5 of the parts'
# md5s>-N") and a composite checksum ("<base64 of the parts' checksums>-N").
_PARTS_SUFFIX = re.compile(r"-\d+$")
_MD5_PARTS = re.compile(r"^[0-9a-f]{32}-\d+$")
# S3 "additional checksums", in order of preference (full-object CRCs are cheapest to verify).
_ADDITIONAL = (
    ("CRC64NVME", "s3-crc64nvme"),
    ("CRC32C", "s3-crc32c"),
    ("CRC32", "s3-crc32"),
    ("SHA256", "s3-sha256"),
    ("SHA1", "s3-sha1"),
)
_VALUE_KEYS = tuple((f"Checksum{field}", algorithm) for field, algorithm in _ADDITIONAL)
_VALUE_KEY_NAMES = frozenset(key for key, _ in _VALUE_KEYS)


class ControlPlane(Protocol):
    """What S3Source needs besides the bytes: one of s3botocore.BotocorePlane, s3rest.RestPlane."""

    region: str
    credentials: Any  # with get_frozen_credentials(), or None (anonymous)
    bucket_url: str

    def list_objects(
        self, folder: str, start_after: str = ""
    ) -> Iterator[dict[str, Any] | PageEnd]: ...
    def list_keys(self, folder: str, start_after: str = "") -> Iterator[list[KeyRow]]: ...
    def head_object(self, key: str) -> dict[str, Any] | None: ...
    def head_part(self, key: str, number: int) -> dict[str, Any] | None: ...
    def close(self) -> None: ...


@dataclass(frozen=True)
class S3Location:
    bucket: str
    prefix: str  # "" for the whole bucket; ends with "/" when the URI named a folder
    version_id: str | None = None  # ?versionId=: that version of the one object named

    @classmethod
    def parse(cls, location: str) -> S3Location:
        rule = "3-255 lowercase letters, digits, '.', '-'"
        pinned = _VERSION_ID.search(location)
        version_id = unquote(pinned[1]) if pinned else None
        if pinned:
            location = location[: pinned.start()]
        bucket, prefix = split_location("s3", location, _BUCKET, rule)
        if prefix.startswith("/"):
            raise UsageError(f"s3://{location}: the key starts with '/'; remove the extra slash")
        if version_id is not None and (not prefix or prefix.endswith("/")):
            raise UsageError(
                f"s3://{location}: versionId names a version of one object, and this is a "
                "prefix; name the object's key, or drop ?versionId= to fetch the prefix"
            )
        return cls(bucket, prefix, version_id)


class S3Source(Source):
    """Objects under ``s3://bucket/prefix`` (on a ``/`` boundary), or one object."""

    def __init__(self, location: S3Location, settings: SourceSettings) -> None:
        self.location = location
        self.settings = settings
        self.retry = settings.retry
        self._transport = HttpTransport.for_settings(settings)
        self._object_headers = request_headers(settings, reads_object=True)  # once: per GET
        self._plane = self._control_plane()
        credentials = self._plane.credentials
        self._signer = S3HeaderSigner(credentials, self._plane.region) if credentials else None
        bucket_url = urlsplit(self._plane.bucket_url)
        origin = f"{bucket_url.scheme}://{bucket_url.netloc}"
        self._host = host_header(bucket_url)
        self._bucket_path = bucket_url.path
        # Objects over the native path (small ones whole on its loop, ranges on the workers);
        # urllib3 once the native client refused a certificate the CA bundle vouches for.
        self._native = NativeHttp(
            origin, headers={}, timeout=settings.timeout, roots=read_roots(settings.ca_bundle)
        )

    @classmethod
    def from_settings(cls, location: str, settings: SourceSettings) -> Self:
        return cls(S3Location.parse(location), settings)

    def describe(self) -> str:
        pinned = f"?versionId={self.location.version_id}" if self.location.version_id else ""
        return f"s3://{self.location.bucket}/{self.location.prefix}{pinned}"

    def _control_plane(self) -> ControlPlane:
        where, bucket = self.describe(), self.location.bucket
        endpoint = self.settings.endpoint
        parts = urlsplit(endpoint or "")
        if endpoint and (parts.scheme not in ("http", "https") or not parts.hostname):
            raise UsageError(f"invalid S3 endpoint {endpoint!r}: expected http(s)://host[:port]")
        if s3rest.serves(self.settings):
            return s3rest.RestPlane(
                bucket, where, self.settings, self.retry, self._transport, self.location.version_id
            )
        from initializers.sources.s3botocore import BotocorePlane  # ~0.4 s: only when needed

        return BotocorePlane(bucket, where, self.settings, self.retry, self.location.version_id)

    # -- listing --------------------------------------------------------------------------------

    def list(self) -> Listing:
        key = self.location.prefix
        if self.location.version_id is not None:  # one object's version: never a listing
            found = self.retry.call(lambda: self._head_entry(key), key)
            if found is None:
                raise NotFoundError(f"{self.describe()}: no such object or version")
            return one_object(key, found, self._remote_entry)
        return list_prefix(
            key,
            where=self.describe(),
            retry=self.retry,
            list_folder=self._list_objects,
            lookup=self._head_entry,
            remote=self._remote_entry,
        )

    def _remote_entry(self, path: str, entry: Entry) -> RemoteFile:
        return self._remote(path, entry.key, entry.meta)

    def _list_objects(self, folder: str) -> Iterator[Entry | PageEnd]:
        for o in self._plane.list_objects(folder):
            yield o if o is PAGE_END else Entry(o["Key"], int(o.get("Size", 0)), o)

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
        return self._plane.head_object(key)

    def pages_after(self, after: str | None) -> Iterator[list[Listed]] | None:
        """ListObjectsV2 from past ``after`` (its ``start-after``), a page at a time; a pinned
        version of one object is no listing."""
        if self.location.version_id is not None:
            return None
        folder = folder_of(self.location.prefix)
        return self._plane.list_keys(folder, folder + after if after is not None else "")

    def _remote(self, path: str, key: str, obj: Mapping[str, Any]) -> RemoteFile:
        etag = version_of(obj) or ""
        checksum = Checksum("md5", etag) if _MD5_ETAG.match(etag) else None
        additional = full_object_checksum(obj)
        return RemoteFile(
            path=path,
            size=int(obj.get("Size", obj.get("ContentLength", 0))),
            version=etag or None,
            checksum=additional or checksum,
            locator=key,
            # A listing names a checksum's algorithm, not its value: a HEAD may find it later.
            unlisted_digest=additional is None and bool(obj.get("ChecksumAlgorithm")),
        )

    # -- fetching -------------------------------------------------------------------------------

    fetches_whole = True

    def fetch_whole(self, file: RemoteFile) -> AbstractAsyncContextManager[Streamed]:
        """A small object over the native path (the engine's ``wholefiles``), signed as sent."""
        path = self._object_path(file)
        headers = self._headers(path, True, file.version)
        return self._native.get_whole(path, file.size, file.path, headers)

    def open_range(self, file: RemoteFile, start: int, end: int) -> RangeReader:
        whole = start == 0 and end == file.size
        path = self._object_path(file)
        headers = self._headers(path, whole, file.version)
        return self._native.open_range_or_urllib3(
            self._transport, path, headers, start, end, file.path, whole
        )

    def _object_path(self, file: RemoteFile) -> str:
        path = self._bucket_path + quote(file.locator, safe="/~")
        if self.location.version_id is not None:
            path += f"?versionId={quote(self.location.version_id, safe='')}"
        return path

    def _headers(self, path: str, whole: bool, version: str | None) -> dict[str, str]:
        """A GET's headers, signed now. A whole-object GET asks for the object's additional
        checksum (S3 sends it only on those); ``If-Match`` pins the listed version."""
        signed = {"x-amz-checksum-mode": "ENABLED"} if whole else {}
        signed.update(self._object_headers)
        if self._signer is not None:
            signed = self._signer.sign(self._host, path, signed)
        return {**signed, "If-Match": f'"{version}"'} if version else signed

    def checksum_for(self, file: RemoteFile, headers: Mapping[str, str]) -> Checksum | None:
        """The strongest digest sure to describe the object: an additional checksum of the
        whole object (from the GET, else one HEAD); for a multipart object, one of its parts
        (a COMPOSITE checksum, else the ETag's MD5 of the parts' MD5s); for a single-part one,
        the ETag's MD5. No ETag counts with SSE-KMS or SSE-C: it is not the content's MD5."""
        # Only a whole-object response's checksum headers describe the object: what a server
        # attaches to a ranged one (rclone: the object's; others: perhaps the range's) is unsure.
        ranged = bool(headers.get("Content-Range"))
        answer: Mapping[str, Any] = {} if ranged else _checksum_headers(headers)
        count = parts_count(file.version)
        found = full_object_checksum(answer)
        digest = parts_checksum(answer, count) if count else None
        # One HEAD per file fetched in ranges (large files: its cost is nothing beside theirs),
        # or listed with an algorithm the GET did not answer with.
        if found is None and digest is None and (ranged or file.unlisted_digest):
            answer = self._head_object(file.locator) or {}
            found = full_object_checksum(answer)
            digest = parts_checksum(answer, count) if count else None
        if found is not None:
            return found
        sse = headers.get("x-amz-server-side-encryption", "")
        encrypted = (
            sse.startswith("aws:kms")
            or "x-amz-server-side-encryption-customer-algorithm" in headers
        )
        if not count:
            return None if encrypted else file.checksum
        if digest is None and (encrypted or not _MD5_PARTS.match(file.version or "")):
            return None
        sizes = self._part_sizes(file, count)
        if sizes is None:
            return None
        algorithm, value = digest or ("md5", str(file.version))
        return Checksum(algorithm, value, sizes)

    def _part_sizes(self, file: RemoteFile, count: int) -> tuple[int, ...] | None:
        """The sizes of the ``count`` parts of ``file``, from one HEAD of its first: each as
        large as the first but the last, as every SDK's and CLI's multipart upload makes them
        (:meth:`other_checksums` corrects the rare other kind). None where the server tells none.
        One part is the whole object, and asks nothing: the only multipart kind small enough for
        the native loop, which a HEAD would block."""
        if count == 1:
            return (file.size,)
        first = self._head_part(file, 1)
        size = int(first.get("ContentLength") or 0) if first else 0
        if not first or first.get("PartsCount") != count:
            return None
        if not (count - 1) * size < file.size <= count * size:
            return None
        return (size,) * (count - 1) + (file.size - (count - 1) * size,)

    def _head_part(self, file: RemoteFile, number: int) -> dict[str, Any] | None:
        return self.retry.call(partial(self._plane.head_part, file.locator, number), file.locator)

    def other_checksums(self, file: RemoteFile, expected: Checksum) -> Iterator[Checksum]:
        """After a digest of the parts did not match: the same over the parts' actual sizes,
        where they are not the ones :meth:`_part_sizes` inferred (one HEAD a part, only now);
        then the ETag's MD5 of the parts, which a server computes the same way where its
        checksum of the parts may not (moto's CRC32C of the parts, without the crc32c package,
        is a CRC32). No guess can pass corrupt bytes: each is S3's own digest of them."""
        if not expected.parts:
            return
        sizes = self._actual_sizes(file, expected.parts)
        if sizes is None:
            return
        if sizes != expected.parts:
            log.info("%s: its parts differ in size; verifying over their actual sizes", file.path)
            yield replace(expected, parts=sizes)
        if expected.algorithm != "md5" and _MD5_PARTS.match(file.version or ""):
            yield Checksum("md5", str(file.version), sizes)

    def _actual_sizes(self, file: RemoteFile, inferred: tuple[int, ...]) -> tuple[int, ...] | None:
        sizes = list(inferred[:1])
        for number in range(2, len(inferred) + 1):
            part = self._head_part(file, number)
            if not part:
                return None
            sizes.append(int(part.get("ContentLength") or 0))
        return tuple(sizes) if sum(sizes) == file.size else None

    def close(self) -> None:
        self._native.close()
        self._transport.close()
        self._plane.close()


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
    if _VALUE_KEY_NAMES.isdisjoint(obj):
        return None  # a listing's entries name algorithms, not values: the common case
    offered = [(algorithm, str(obj[key])) for key, algorithm in _VALUE_KEYS if obj.get(key)]
    if not offered:
        return None
    kind = str(obj.get("ChecksumType") or "").upper()
    if kind == "COMPOSITE":
        return None
    etag = str(obj.get("ETag") or "").strip('"')
    single_part = bool(etag) and not _PARTS_SUFFIX.search(etag)
    if kind != "FULL_OBJECT" and not single_part:
        return None
    for algorithm, value in offered:
        if not _PARTS_SUFFIX.search(value) and checksums.is_supported(algorithm):
            return Checksum(algorithm, value)
    return None


def parts_count(etag: str | None) -> int:
    """N, for a multipart object's ETag (``...-N``); 0 for any other."""
    suffix = _PARTS_SUFFIX.search(etag or "")
    return int(suffix.group()[1:]) if suffix else 0


def parts_checksum(obj: Mapping[str, Any], count: int) -> tuple[str, str] | None:
    """The preferred additional checksum of ``obj``'s ``count`` parts (a COMPOSITE one) as
    (algorithm, value ending in ``-N``), or None: a value counts when it ends in this object's
    ``-N``, or when the server says ``COMPOSITE`` (its ``-N`` then added)."""
    kind = str(obj.get("ChecksumType") or "").upper()
    if kind == "FULL_OBJECT":
        return None
    for key, algorithm in _VALUE_KEYS:
        value = str(obj.get(key) or "")
        if not value or not checksums.is_supported(algorithm):
            continue
        suffix = _PARTS_SUFFIX.search(value)
        if suffix and suffix.group() == f"-{count}":
            return algorithm, value
        if not suffix and kind == "COMPOSITE":
            return algorithm, f"{value}-{count}"
    return None

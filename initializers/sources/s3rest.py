"""S3's control plane as signed REST calls, for an S3-compatible endpoint with static keys.

The common Kubeflow case (``ENDPOINT`` plus ``ACCESS_KEY_ID`` / ``SECRET_ACCESS_KEY``, or
``--anonymous``) needs nothing of botocore's: no credential chain, no region discovery, no
endpoint rules (path-style addressing on the given endpoint, as the botocore path configures
too). Importing botocore and building its client cost ~0.4 s before the first request
(measured here); ListObjectsV2 and HeadObject are two GETs/HEADs signed by the same native
SigV4 signer as the data GETs, through the same transport. Everything else goes through
:mod:`initializers.sources.s3botocore`.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from initializers.errors import NotFoundError, TransientError, UsageError
from initializers.options import SourceSettings
from initializers.retry import RetryPolicy
from initializers.sources.paging import PAGE_END, PageEnd
from initializers.sources.s3errors import host_header, s3_error
from initializers.sources.s3options import request_headers
from initializers.sources.s3pages import KeyRow, Page, key_page, namespace_of, tree_page
from initializers.sources.s3sign import S3HeaderSigner
from initializers.transport import HttpTransport

_HEADER_FIELDS = {  # HeadObject's response headers, in botocore's output keys
    "etag": "ETag",
    "x-amz-checksum-type": "ChecksumType",
    "x-amz-checksum-crc32": "ChecksumCRC32",
    "x-amz-checksum-crc32c": "ChecksumCRC32C",
    "x-amz-checksum-crc64nvme": "ChecksumCRC64NVME",
    "x-amz-checksum-sha1": "ChecksumSHA1",
    "x-amz-checksum-sha256": "ChecksumSHA256",
    "x-amz-server-side-encryption": "ServerSideEncryption",
    "x-amz-server-side-encryption-customer-algorithm": "SSECustomerAlgorithm",
}


def serves(settings: SourceSettings) -> bool:
    """True when these settings need nothing of botocore: an endpoint, and static keys or none."""
    static = bool(settings.access_key_id and settings.secret_access_key)
    return bool(settings.endpoint) and not settings.role_arn and (settings.anonymous or static)


@dataclass(frozen=True)
class StaticCredentials:
    """The keys as given, in the shape the signer reads (botocore's frozen credentials)."""

    access_key: str
    secret_key: str
    token: str | None

    def get_frozen_credentials(self) -> StaticCredentials:
        return self


class RestPlane:
    """Listing, HEAD, credentials, region and the bucket's URL, without botocore."""

    def __init__(
        self,
        bucket: str,
        where: str,
        settings: SourceSettings,
        retry: RetryPolicy,
        transport: HttpTransport,
        version_id: str | None = None,
    ) -> None:
        """``version_id``: every HEAD asks for that version of its object (the run fetches
        one object, pinned by ``?versionId=``)."""
        self.bucket = bucket
        self.where = where
        self.retry = retry
        self._transport = transport
        endpoint = str(settings.endpoint).rstrip("/")  # checked by S3Source
        self.region = "us-east-1" if settings.region == "auto" else settings.region
        self.credentials = (
            None
            if settings.anonymous
            else StaticCredentials(
                str(settings.access_key_id), str(settings.secret_access_key), settings.session_token
            )
        )
        if settings.addressing_style == "virtual":  # the bucket in the host name
            parts = urlsplit(endpoint)
            self.bucket_url = f"{parts.scheme}://{bucket}.{parts.netloc}{parts.path}/"
        else:  # path-style: what "auto" means on a custom endpoint
            self.bucket_url = f"{endpoint}/{quote(bucket)}/"
        split = urlsplit(self.bucket_url)
        self._origin = f"{split.scheme}://{split.netloc}"
        self._host = host_header(split)
        self._path = split.path
        self._signer = S3HeaderSigner(self.credentials, self.region) if self.credentials else None
        self._extra = {reads: request_headers(settings, reads) for reads in (False, True)}
        self._pinned = f"versionId={quote(version_id, safe='')}" if version_id else ""

    def list_objects(
        self, folder: str, start_after: str = ""
    ) -> Iterator[dict[str, Any] | PageEnd]:
        """Every object under ``folder`` (past the key ``start_after``, if given), page after
        page, in botocore's ListObjectsV2 keys, with :data:`PAGE_END` between pages."""
        for page in self._pages(folder, start_after, tree_page):
            yield from page.entries
            if page.truncated and page.token:
                yield PAGE_END

    def list_keys(self, folder: str, start_after: str = "") -> Iterator[list[KeyRow]]:
        """The same listing a page at a time, each object as a bare :data:`KeyRow` row."""
        read = partial(key_page, folder)
        return (page.entries for page in self._pages(folder, start_after, read))

    def _pages(
        self, folder: str, start_after: str, read: Callable[[bytes], Page]
    ) -> Iterator[Page]:
        """The listing's pages as ``read`` reads them, each asked for once the one before it
        has been taken in full."""
        token: str | None = None
        while True:
            query = {"list-type": "2", "prefix": folder, "encoding-type": "url"}
            if token:
                query["continuation-token"] = token
            elif start_after:
                query["start-after"] = start_after
            page = self.retry.call(partial(self._list_page, query, read), self.where)
            yield page
            if not page.truncated or not page.token:
                return
            token = page.token

    def head_object(self, key: str) -> dict[str, Any] | None:
        """HeadObject's answer in botocore's keys, or None when there is no such object."""
        status, headers, _ = self._request(
            "HEAD",
            self._path + quote(key, safe="/~"),
            self._pinned,
            {"x-amz-checksum-mode": "ENABLED"},
        )
        if status == 404:
            return None
        if status != 200:
            raise s3_error(str(status), status, headers, self.where, self.bucket)
        found: dict[str, Any] = {"ContentLength": int(headers.get("content-length", 0))}
        for header, field in _HEADER_FIELDS.items():
            if headers.get(header):
                found[field] = headers[header]
        return found

    def head_part(self, key: str, number: int) -> dict[str, Any] | None:
        """HeadObject of part ``number`` (``?partNumber=``): the part's ContentLength and the
        object's PartsCount, or None where the server knows no such object or part."""
        status, headers, _ = self._request(
            "HEAD",
            self._path + quote(key, safe="/~"),
            "&".join(q for q in (f"partNumber={number}", self._pinned) if q),
        )
        if status not in (200, 206):
            failure = s3_error(str(status), status, headers, self.where, self.bucket)
            if isinstance(failure, NotFoundError | UsageError):
                return None
            raise failure
        count = headers.get("x-amz-mp-parts-count", "")
        return {
            "ContentLength": int(headers.get("content-length", 0)),
            "PartsCount": int(count) if count.isdigit() else None,
        }

    def close(self) -> None:
        """The transport is the source's; nothing of its own to release."""

    def _list_page(self, query: dict[str, str], read: Callable[[bytes], Page]) -> Page:
        """One page of the listing, read by ``read``; the server's error for any other answer."""
        encoded = urlencode(sorted(query.items()), quote_via=quote, safe="~")
        status, headers, body = self._request("GET", self._path, encoded)
        if status != 200:
            raise s3_error(_error_code(body), status, headers, self.where, self.bucket)
        try:
            return read(body)
        except ET.ParseError:
            raise TransientError(f"{self.where}: the listing was not valid XML") from None

    def _request(
        self, method: str, path: str, query: str, headers: dict[str, str] | None = None
    ) -> tuple[int, Any, bytes]:
        target = f"{path}?{query}" if query else path
        headers = dict(headers or {})
        headers.update(self._extra[method == "HEAD"])
        if self._signer is not None:
            headers = self._signer.sign(self._host, target, headers, method=method)
        return self._transport.request(method, self._origin + target, headers, self.where)


def _error_code(body: bytes) -> str:
    """The ``<Code>`` of an S3 error document ("" for a body that is none)."""
    try:
        root = ET.fromstring(body)
    except ET.ParseError:
        return ""
    return root.findtext(f"{namespace_of(root)}Code", "")

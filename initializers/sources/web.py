"""http:// and https:// — one file by URL; ``.tar``, ``.tar.gz``/``.tgz`` and ``.zip`` are unpacked.

The listing is one ranged GET of the first byte (not a HEAD: a presigned S3 or GCS URL is
signed for GET only). A ``206`` with ``Content-Range`` says the server serves ranges, so the
file is fetched in parallel ranges and a rerun resumes it; a ``200`` says it does not, so the
file is streamed whole, from its start on every attempt. The file's version is its strong ETag
(every later request carries ``If-Match``, so a file replaced mid-fetch fails with exit 5 rather
than mixing two versions), else its ``Last-Modified`` date, else its size.

An empty file has no first byte: some servers answer its range with ``416`` (GCS; S3, as moto
models it, without a ``Content-Range``), others ignore the range and answer ``200`` with
``Content-Length: 0`` (nginx). After a refused first byte the listing asks once more without a
range, and lists the file only if that answer says it is empty; anything else stays the error
it was.

A URL may pin the file's content the way pip's hash links do: ``#sha256=<hex>`` (or ``md5``,
``sha1``, ``sha384``, ``sha512``). The fragment never reaches the server; the file (the archive,
before it is unpacked) is verified against it like any source's checksum, a mismatch exits 5,
and a new pin counts as a new version, so a rerun checks it. Without one, only the size is
verified: no HTTP header carries a digest of the bytes.

Extra request headers for private servers come from ``HTTP_HEADERS`` (a JSON object); their
values are never logged, and they are dropped, as ``Authorization`` always is, when a redirect
leads to another host. The query string of a URL (where presigned URLs keep their signature)
never appears in logs either.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Self
from urllib.parse import unquote, urlsplit, urlunsplit

from initializers import checksum as checksums
from initializers.errors import InitializerError, IntegrityError, UsageError
from initializers.fsutil import UnsafePathError, safe_relpath
from initializers.options import SourceSettings
from initializers.sources.base import Checksum, Layer, Layered, Listing, RemoteFile, Source
from initializers.streams import RangeReader
from initializers.transport import HttpTransport

ARCHIVE_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".zip")
_TOTAL = re.compile(r"/(\d+)\s*$")
_PIN = re.compile(r"(\w+)=([0-9a-fA-F]+)")


def pinned_digest(fragment: str, shown: str) -> Checksum | None:
    """The digest a URL's fragment pins (``sha256=<hex>``), None without a fragment."""
    if not fragment:
        return None
    found = _PIN.fullmatch(fragment)
    if (
        not found
        or found[1] not in checksums.HEX_HASHES
        or len(found[2]) != 2 * hashlib.new(found[1]).digest_size
    ):
        raise UsageError(
            f"{shown}#{fragment}: the fragment is not a digest of the file; pin its content "
            "with #sha256=<64 hex digits> (or md5, sha1, sha384, sha512), or remove it"
        )
    return Checksum(found[1], found[2].lower())


class WebSource(Source):
    """The file at an http(s) URL."""

    def __init__(self, url: str, settings: SourceSettings) -> None:
        parts = urlsplit(url)
        if not parts.hostname:
            raise UsageError(
                f"{parts.scheme}:// URI names no host; e.g. https://example.com/model.tar.gz"
            )
        self.url = urlunsplit(parts._replace(fragment=""))
        self._shown = urlunsplit(
            (parts.scheme, parts.netloc.rpartition("@")[2], parts.path, "", "")
        )
        self._pin = pinned_digest(parts.fragment, self._shown)
        try:
            self.name = safe_relpath(unquote(parts.path.rsplit("/", 1)[-1]))
        except UnsafePathError:
            raise UsageError(
                f"{self._shown} does not end with a file name; give the URL of one file "
                "(an archive is unpacked)"
            ) from None
        self.retry = settings.retry
        self._headers = dict(settings.http_headers)
        self._transport = HttpTransport.for_settings(settings)

    @classmethod
    def from_settings(cls, location: str, settings: SourceSettings) -> Self:
        scheme = settings.storage_uri.split(":", 1)[0].lower()
        return cls(f"{scheme}://{location}", settings)

    def describe(self) -> str:
        return self._shown

    def list(self) -> Listing:
        try:
            headers = self._probe(ranged=True)
        except IntegrityError as refused:
            # A 416 (or a malformed range answer): the transport raises on the status, so the
            # 416's Content-Range never reaches here; a plain GET says whether the file is empty.
            headers = self._probe(ranged=False)
            if headers.get("Content-Length") != "0" or "Content-Range" in headers:
                raise refused from None
        return Listing(None, [self._remote(headers)])

    def layered(self, listing: Listing) -> Layered | None:
        """A ``.tar``, ``.tar.gz``/``.tgz`` or ``.zip`` is unpacked (KServe's rule)."""
        only = listing.files[0]
        if not only.path.lower().endswith(ARCHIVE_SUFFIXES):
            return None
        return Layered((Layer(only),), only.version)

    def _probe(self, *, ranged: bool) -> Mapping[str, str]:
        """The response headers of a GET of the first byte (not ``ranged``: of the whole file;
        either way no body is read)."""
        probe = self.retry.call(
            lambda: self._transport.open_range(
                self.url, self._headers, 0, 1, self.name, whole=not ranged, private=self._headers
            ),
            self.name,
        )
        with probe:
            return probe.headers

    def _remote(self, headers: Mapping[str, str]) -> RemoteFile:
        content_range = headers.get("Content-Range")
        found = _TOTAL.search(content_range) if content_range else None
        if found:
            size, ranged = int(found[1]), True
        elif not content_range and headers.get("Content-Length", "").isdigit():
            size, ranged = int(headers["Content-Length"]), False
        else:
            raise InitializerError(
                f"{self._shown}: the server does not say how large the file is "
                "(no Content-Length); it cannot be fetched with verification"
            )
        etag = headers.get("ETag", "")
        strong = etag if etag.startswith('"') else None
        version = strong or headers.get("Last-Modified") or f"size {size}"
        if self._pin:  # a new pin is checked on the rerun, not vouched for by the old manifest
            version = f"{version}, pinned {self._pin}"
        return RemoteFile(self.name, size, version, self._pin, locator=strong or "", ranged=ranged)

    def open_range(self, file: RemoteFile, start: int, end: int) -> RangeReader:
        headers = {**self._headers, "If-Match": file.locator} if file.locator else self._headers
        whole = start == 0 and end == file.size
        return self._transport.open_range(
            self.url, headers, start, end, file.path, whole=whole, private=self._headers
        )

    def close(self) -> None:
        self._transport.close()

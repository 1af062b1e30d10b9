"""The S3 control plane of the benchmark endpoint: listings, bucket checks, odd-shaped requests.

nginx serves every plain object GET/HEAD straight from disk; it hands this server only what it
cannot answer itself: requests with a query string (ListObjectsV2/V1, GetBucketLocation,
``?partNumber=``), requests on the bucket itself (HeadBucket, ListObjects), and other methods.
Listings report each object's CRC32 checksum algorithm and type; an object GET/HEAD sent here
carries the checksum headers when asked (``x-amz-checksum-mode: ENABLED``, no ``Range``), as
nginx does for the plain ones. A request nginx marks ``X-Bench-Etags: nginx`` comes from the
port that serves objects as a plain nginx would (:func:`nginx_etag`, no checksums): its answers
carry the same ETags and no checksums either.
Run as its own process: ``python -m benchmarks.s3api --index INDEX --data DIR --port N``.
"""

from __future__ import annotations

import argparse
import base64
import bisect
import contextlib
import json
import os
import sys
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote, urlsplit
from xml.sax.saxutils import escape

from benchmarks.fixtures import BUCKET, FIXED_MTIME, MULTIPART_CHUNK, MULTIPART_THRESHOLD

NS = "http://s3.amazonaws.com/doc/2006-03-01/"
ISO_MTIME = "2025-01-01T00:00:00.000Z"  # FIXED_MTIME in S3's listing format
HTTP_MTIME = formatdate(FIXED_MTIME, usegmt=True)
NGINX_FLAVOUR = "X-Bench-Etags"  # set to "nginx" by the nginx-style port's API location


def nginx_etag(size: int) -> str:
    """nginx's own ETag of a fixture file (``"<mtime hex>-<size hex>"``): not an MD5."""
    return f'"{FIXED_MTIME:x}-{size:x}"'


class Index:
    """The bucket's objects, sorted by key, as the listing reports them."""

    def __init__(self, objects: dict[str, dict]) -> None:
        self.objects = objects
        self.keys = sorted(objects)

    def page(
        self, prefix: str, delimiter: str, after: str, max_keys: int
    ) -> tuple[list[str], list[str], str | None]:
        """(keys, common prefixes, last item when truncated) after ``after``, at most max_keys."""
        keys: list[str] = []
        prefixes: list[str] = []
        start = bisect.bisect_right(self.keys, after) if after else 0
        start = max(start, bisect.bisect_left(self.keys, prefix))
        last: str | None = None
        for key in self.keys[start:]:
            if not key.startswith(prefix):
                break
            if after and delimiter and after.endswith(delimiter) and key.startswith(after):
                continue
            item = key
            if delimiter:
                cut = key.find(delimiter, len(prefix))
                if cut >= 0:
                    item = key[: cut + len(delimiter)]
                    if prefixes and prefixes[-1] == item:
                        continue
            if len(keys) + len(prefixes) == max_keys:
                return keys, prefixes, last
            (prefixes if item != key else keys).append(item)
            last = item
        return keys, prefixes, None


class Handler(BaseHTTPRequestHandler):
    """One S3 control-plane request; path-style addressing only."""

    protocol_version = "HTTP/1.1"
    # Headers and body leave in two writes: with Nagle's algorithm, a small body waited for
    # nginx's delayed ACK of the headers, ~40 ms on every short listing page (the last one of
    # a listing), which S3 does not make anyone wait.
    disable_nagle_algorithm = True
    index: Index
    data: Path

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _nginx_style(self) -> bool:
        return self.headers.get(NGINX_FLAVOUR, "") == "nginx"

    @staticmethod
    def _etag(obj: dict, nginx_style: bool) -> str:
        return nginx_etag(obj["size"]) if nginx_style else obj["etag"]

    # --- plumbing -------------------------------------------------------------------------
    def _split(self) -> tuple[str, str, dict[str, str]]:
        parts = urlsplit(self.path)
        bucket, _, key = unquote(parts.path).lstrip("/").partition("/")
        query = {k: v[0] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        return bucket, key, query

    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        hdrs = {"Content-Type": "application/xml", "x-amz-request-id": "bench"} | (headers or {})
        for k, v in hdrs.items():
            self.send_header(k, v)
        if "Content-Length" not in hdrs:
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD" and body:
            self.wfile.write(body)

    def _error(self, status: int, code: str, message: str) -> None:
        body = (
            f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
            f"<Message>{escape(message)}</Message><RequestId>bench</RequestId></Error>"
        ).encode()
        self._send(status, body)

    # --- verbs ----------------------------------------------------------------------------
    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        bucket, key, query = self._split()
        if bucket != BUCKET:
            self._error(404, "NoSuchBucket", "The specified bucket does not exist")
        elif key:
            self._object(key, query)
        elif "location" in query:
            body = f'<?xml version="1.0" encoding="UTF-8"?>\n<LocationConstraint xmlns="{NS}"/>'
            self._send(200, body.encode())
        elif self.command == "HEAD":
            self._send(200, headers={"x-amz-bucket-region": "us-east-1"})
        elif query.get("list-type") == "2":
            self._list(query, v2=True)
        elif not (set(query) - {"prefix", "delimiter", "marker", "max-keys", "encoding-type"}):
            self._list(query, v2=False)
        else:
            self._error(501, "NotImplemented", f"bench endpoint: no support for {self.path}")

    def do_PUT(self) -> None:
        self._error(501, "NotImplemented", "the bench endpoint is read-only")

    do_POST = do_DELETE = do_PUT

    # --- S3 operations --------------------------------------------------------------------
    def _list(self, query: dict[str, str], v2: bool) -> None:
        prefix = query.get("prefix", "")
        delimiter = query.get("delimiter", "")
        max_keys = min(int(query.get("max-keys", "1000") or 1000), 1000)
        url = query.get("encoding-type") == "url"
        if v2:
            token = query.get("continuation-token", "")
            after = base64.urlsafe_b64decode(token).decode() if token else ""
            after = after or query.get("start-after", "")
        else:
            after = query.get("marker", "")
        keys, prefixes, last = self.index.page(prefix, delimiter, after, max_keys)

        def enc(s: str) -> str:
            return escape(quote(s, safe="/") if url else s)

        out = [
            f'<?xml version="1.0" encoding="UTF-8"?>\n<ListBucketResult xmlns="{NS}">',
            f"<Name>{BUCKET}</Name><Prefix>{enc(prefix)}</Prefix><MaxKeys>{max_keys}</MaxKeys>",
            f"<IsTruncated>{'true' if last else 'false'}</IsTruncated>",
        ]
        if delimiter:
            out.append(f"<Delimiter>{enc(delimiter)}</Delimiter>")
        if url:
            out.append("<EncodingType>url</EncodingType>")
        if v2:
            out.append(f"<KeyCount>{len(keys) + len(prefixes)}</KeyCount>")
            if query.get("continuation-token"):
                out.append(f"<ContinuationToken>{query['continuation-token']}</ContinuationToken>")
            if last:
                token = base64.urlsafe_b64encode(last.encode()).decode()
                out.append(f"<NextContinuationToken>{token}</NextContinuationToken>")
        else:
            out.append(f"<Marker>{enc(query.get('marker', ''))}</Marker>")
            if last and delimiter:
                out.append(f"<NextMarker>{enc(last)}</NextMarker>")
        nginx_style = self._nginx_style()  # asked once for the page, not once a key
        for key in keys:
            obj = self.index.objects[key]
            checksum = (
                ""
                if nginx_style
                else "<ChecksumAlgorithm>CRC32</ChecksumAlgorithm>"
                f"<ChecksumType>{obj['checksum_type']}</ChecksumType>"
            )
            etag = escape(self._etag(obj, nginx_style), {chr(34): "&quot;"})
            out.append(
                f"<Contents><Key>{enc(key)}</Key><LastModified>{ISO_MTIME}</LastModified>"
                f"<ETag>{etag}</ETag>{checksum}"
                f"<Size>{obj['size']}</Size><StorageClass>STANDARD</StorageClass></Contents>"
            )
        for p in prefixes:
            out.append(f"<CommonPrefixes><Prefix>{enc(p)}</Prefix></CommonPrefixes>")
        out.append("</ListBucketResult>")
        self._send(200, "".join(out).encode())

    def _object(self, key: str, query: dict[str, str]) -> None:
        """GET/HEAD of one object when a query string sent it here (e.g. ``?partNumber=1``)."""
        obj = self.index.objects.get(key)
        if obj is None:
            self._error(404, "NoSuchKey", "The specified key does not exist.")
            return
        size = obj["size"]
        start, end, status = 0, size - 1, 200
        nginx_style = self._nginx_style()
        headers = {
            "Content-Type": "application/octet-stream",
            "ETag": self._etag(obj, nginx_style),
            "Last-Modified": HTTP_MTIME,
            "Accept-Ranges": "bytes",
        }
        mode = self.headers.get("x-amz-checksum-mode", "")
        asked = mode.lower() == "enabled" and "Range" not in self.headers
        if asked and not nginx_style:
            headers["x-amz-checksum-crc32"] = obj["checksum_crc32"]
            headers["x-amz-checksum-type"] = obj["checksum_type"]
        if "partNumber" in query:
            part = int(query["partNumber"])
            parts = max(1, -(-size // MULTIPART_CHUNK)) if size >= MULTIPART_THRESHOLD else 1
            if not 1 <= part <= parts:
                self._error(416, "InvalidPartNumber", "The requested partnumber is not satisfiable")
                return
            if size >= MULTIPART_THRESHOLD:
                start = (part - 1) * MULTIPART_CHUNK
                end = min(size, part * MULTIPART_CHUNK) - 1
                headers["x-amz-mp-parts-count"] = str(parts)
                status = 206
                headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        elif rng := self.headers.get("Range"):
            first, _, last = rng.removeprefix("bytes=").partition("-")
            if first:
                start, end = int(first), min(int(last) if last else size - 1, size - 1)
            else:
                start = max(0, size - int(last))
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        headers["Content-Length"] = str(end - start + 1)
        self._send(status, headers=headers)
        if self.command == "GET":
            with open(self.data / BUCKET / key, "rb") as f:
                offset, left = start, end - start + 1
                while left:
                    sent = os.sendfile(self.wfile.fileno(), f.fileno(), offset, left)
                    if not sent:
                        break
                    offset, left = offset + sent, left - sent


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        """A client that hangs up mid-answer (a killed contender) is not worth a traceback."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--index", type=Path, required=True)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    Handler.index = Index(json.loads(args.index.read_text())["objects"])
    Handler.data = args.data
    server = Server(("127.0.0.1", args.port), Handler)
    print(f"s3api listening on {args.port}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())

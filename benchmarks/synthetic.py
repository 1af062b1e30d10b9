"""An S3 endpoint of any number of small objects that costs no disk: their bytes come from names.

Object ``i`` is ``d/<i // 1000>/<i>-<k>k.bin``, ``k`` KiB long (1 to 8, spread by ``i``): nginx
serves each GET from one of eight blob files chosen by the name's ``<k>k`` (with Range,
keep-alive, and its own ETag, which ``If-Match`` then agrees with), and a Python server on
another port answers ListObjectsV2 by computing the page from its continuation token, so a
listing of a million keys is made as it is read. nginx passes bucket requests to it. What this
endpoint is like: S3 with nginx-style ETags (not MD5s) and no additional checksums, as the
issue on speed asks to measure; every file is verified by its size.
"""

from __future__ import annotations

import os
import threading
from bisect import bisect_right
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from benchmarks import latency
from benchmarks.nginx import Nginx, free_port

BUCKET = "bench"
PREFIX = "d/"
PAGE = 1000
ISO_MTIME = "2026-01-01T00:00:00.000Z"


def key(index: int, size_kib: int | None = None) -> str:
    """Object ``index``'s key (``size_kib``: its :func:`kib`, where the caller has it)."""
    size = kib(index) if size_kib is None else size_kib
    return f"{PREFIX}{index // 1000:04d}/{index:07d}-{size}k.bin"


def kib(index: int) -> int:
    return 1 + (index * 2654435761 >> 7) % 8


def total_bytes(count: int) -> int:
    return sum(kib(i) for i in range(count)) * 1024


class Listing(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, count: int, etags: dict[int, str]) -> None:
        super().__init__(("127.0.0.1", 0), _ListHandler)
        self.count = count
        self.etags = etags


class _ListHandler(BaseHTTPRequestHandler):
    server: Listing
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        query = {k: v[0] for k, v in parse_qs(urlsplit(self.path).query).items()}
        if query.get("list-type") != "2":
            self._send(501, b"<Error><Code>NotImplemented</Code></Error>")
            return
        start = int(query.get("continuation-token") or 0)
        if "continuation-token" not in query and query.get("start-after"):  # keys sort as made
            start = bisect_right(range(self.server.count), query["start-after"], key=key)
        if not query.get("prefix", "").startswith(PREFIX[:-1]) and query.get("prefix"):
            start = self.server.count  # another prefix: nothing
        end = min(start + min(int(query.get("max-keys", PAGE)), PAGE), self.server.count)
        out = [
            '<?xml version="1.0" encoding="UTF-8"?><ListBucketResult '
            'xmlns="http://s3.amazonaws.com/doc/2006-03-01/">',
            f"<Name>{BUCKET}</Name><Prefix>{query.get('prefix', '')}</Prefix>",
            f"<KeyCount>{end - start}</KeyCount><MaxKeys>{PAGE}</MaxKeys>",
            f"<IsTruncated>{'true' if end < self.server.count else 'false'}</IsTruncated>",
        ]
        if end < self.server.count:
            out.append(f"<NextContinuationToken>{end}</NextContinuationToken>")
        etags = self.server.etags
        for i in range(start, end):  # the listing's server is on the contenders' CPUs: lean
            k = kib(i)
            out.append(
                f"<Contents><Key>{key(i, k)}</Key>"
                f"<LastModified>{ISO_MTIME}</LastModified><ETag>&quot;{etags[k]}&quot;</ETag>"
                f"<Size>{k * 1024}</Size><StorageClass>STANDARD</StorageClass></Contents>"
            )
        out.append("</ListBucketResult>")
        self._send(200, "".join(out).encode())

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def _blobs(folder: Path) -> dict[int, str]:
    """The eight blob files, and nginx's ETag of each (``"<mtime hex>-<size hex>"``)."""
    folder.mkdir(parents=True, exist_ok=True)
    etags = {}
    for k in range(1, 9):
        blob = folder / f"{k}k"
        blob.write_bytes(bytes((j * 7 + k) % 251 for j in range(k * 1024)))
        os.utime(blob, (1767225600, 1767225600))
        info = blob.stat()
        etags[k] = f"{int(info.st_mtime):x}-{info.st_size:x}"
    return etags


@contextmanager
def endpoint(count: int, run_dir: Path, delay_s: float = 0.0) -> Iterator[str]:
    """The endpoint's URL while it serves ``count`` objects under ``s3://bench/d/``; every
    response waits ``delay_s`` before its first byte (:mod:`benchmarks.latency`)."""
    etags = _blobs(run_dir / "blobs")
    listing = Listing(count, etags)
    threading.Thread(target=listing.serve_forever, daemon=True).start()
    port = free_port()
    body = f"""
    server {{
        listen 127.0.0.1:{port};
        {latency.first_byte_delay(delay_s)}
        location ~ "^/{BUCKET}/?$" {{
            proxy_pass http://127.0.0.1:{listing.server_address[1]};
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}
        location ~ "^/{BUCKET}/d/[0-9]+/[0-9]+-([1-8])k\\.bin$" {{
            alias {run_dir}/blobs/$1k;
        }}
    }}
"""
    server = Nginx(run_dir, body, modules=latency.MODULES if delay_s > 0 else ())
    server.start([port])
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()
        listing.shutdown()

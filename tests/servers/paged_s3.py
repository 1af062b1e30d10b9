"""An S3 listing a few keys a page, whose faults a spec sets: pages that fail, keys added
between pages, listed sizes that lie, pages that overlap, ``start-after`` ignored.

Keys come back in S3's order and pages resume past a key (the continuation token is the last
key given, as ``start-after`` is); an object's body is made from its key (:func:`body_of`)."""

from __future__ import annotations

import bisect
import contextlib
import hashlib
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

PER_PAGE = 5  # keys per listing page: hundreds of pages stay quick to serve


def body_of(key: str) -> bytes:
    return f"bytes of {key}\n".encode()


class Prefix:
    """A bucket's keys, a page of ``PER_PAGE`` at a time, and how the server misbehaves."""

    def __init__(self, keys: list[str]) -> None:
        self.keys = sorted(keys)
        self.sizes: dict[str, int] = {}  # a listed size other than the body's
        self.failures: dict[int, int] = {}  # page -> how many times it answers 503 first
        self.requests: Counter[int] = Counter()  # page -> listing requests
        self.gets: Counter[str] = Counter()  # key -> object GETs
        self.heads: Counter[str] = Counter()  # key -> object HEADs
        self.refuses_objects = False  # True: objects' GETs and HEADs get 403, listings pass
        self.after_page: dict[int, list[str]] = {}  # page -> keys added once it was served
        self.overlap = False  # each page starts with the previous page's last key again
        self.honours_start_after = True  # False: ``start-after`` is ignored, as by some stores
        self.starts_after: list[str] = []  # the ``start-after`` of each listing asked for
        self.etags: dict[str, str] = {}  # a listed ETag other than the body's MD5
        self.page_seconds = 0.0  # how long each listing page from ``slow_from`` on takes
        self.slow_from = ""
        # Entries laid out as AWS lays them out, which the warm rerun's check reads with a
        # pattern; False: the size before the ETag, which sends every page to ElementTree.
        self.aws_layout = True

    def page(self, after: str) -> tuple[int, list[str], bool]:
        """The page after key ``after`` ("" for the first), as S3 pages: by key, so a key
        added meanwhile before the position is not listed and none is listed twice. Its
        number is the pages before it."""
        start = bisect.bisect_right(self.keys, after) if after else 0
        if self.overlap and start:
            start -= 1
        return (
            start // PER_PAGE,
            self.keys[start : start + PER_PAGE],
            start + PER_PAGE < len(self.keys),
        )


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out at once, not 40 ms apart
    server: PagedS3

    def do_GET(self) -> None:
        prefix = self.server.prefix
        parts = urlsplit(self.path)
        if parts.path not in ("/bucket", "/bucket/"):  # botocore asks for the bucket unslashed
            key = unquote(parts.path.removeprefix("/bucket/"))
            prefix.gets[key] += 1
            self._send_object(key)
            return
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        after = query.get("continuation-token", "")
        if not after and "start-after" in query:
            prefix.starts_after.append(query["start-after"])
            after = query["start-after"] if prefix.honours_start_after else ""
        number, keys, more = prefix.page(after)
        if keys and keys[0] >= prefix.slow_from:
            time.sleep(prefix.page_seconds)
        prefix.requests[number] += 1
        if prefix.failures.get(number, 0) > 0:
            prefix.failures[number] -= 1
            self._send(503, b"<Error><Code>SlowDown</Code></Error>", "application/xml")
            return
        body = _listing(prefix, keys, more)
        # Added before the page goes out: the next page's request must find them there.
        for key in prefix.after_page.pop(number, []):
            prefix.keys = sorted([*prefix.keys, key])
        self._send(200, body, "application/xml")

    def do_HEAD(self) -> None:
        key = unquote(urlsplit(self.path).path.removeprefix("/bucket/"))
        self.server.prefix.heads[key] += 1
        self._send_object(key, head=True)

    def _send_object(self, key: str, head: bool = False) -> None:
        if self.server.prefix.refuses_objects:
            self._send(403, b"<Error><Code>AccessDenied</Code></Error>", "application/xml", head)
        else:
            self._send(200, body_of(key), "application/octet-stream", head)

    def _send(self, status: int, body: bytes, kind: str, head: bool = False) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def _listing(prefix: Prefix, keys: list[str], more: bool) -> bytes:
    contents = "".join(_entry(prefix, key) for key in keys)
    token = f"<NextContinuationToken>{keys[-1]}</NextContinuationToken>" if more else ""
    return (
        '<?xml version="1.0"?><ListBucketResult><Name>bucket</Name>'
        f"<IsTruncated>{'true' if more else 'false'}</IsTruncated>{token}{contents}"
        "</ListBucketResult>"
    ).encode()


def _entry(prefix: Prefix, key: str) -> str:
    size = f"<Size>{prefix.sizes.get(key, len(body_of(key)))}</Size>"
    etag = (
        f"<ETag>&quot;{prefix.etags.get(key) or hashlib.md5(body_of(key)).hexdigest()}&quot;</ETag>"
    )
    if not prefix.aws_layout:
        return f"<Contents><Key>{key}</Key>{size}{etag}</Contents>"
    modified = "<LastModified>2026-01-01T00:00:00.000Z</LastModified>"
    kind = "<StorageClass>STANDARD</StorageClass>"
    return f"<Contents><Key>{key}</Key>{modified}{etag}{size}{kind}</Contents>"


class PagedS3(ThreadingHTTPServer):
    prefix: Prefix


@contextmanager
def paged_s3(prefix: Prefix) -> Iterator[str]:
    """The endpoint's URL while it serves ``prefix``."""
    server = PagedS3(("127.0.0.1", 0), _Handler)
    server.prefix = prefix
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def numbered_keys(count: int) -> list[str]:
    """``count`` keys under ``d/``, a hundred a folder."""
    return [f"d/{i // 100:03d}/{i:05d}.txt" for i in range(count)]


def env_for(endpoint: str, out: Path, **extra: str) -> dict[str, str]:
    """The initializer's environment to fetch ``s3://bucket/d`` from ``endpoint`` to ``out``."""
    return {
        "STORAGE_URI": "s3://bucket/d",
        "ENDPOINT": endpoint,
        "ANONYMOUS": "true",
        "REGION": "us-east-1",
        "OUTPUT_PATH": str(out),
        "PROGRESS_INTERVAL": "60",
        **extra,
    }


def holds_bodies(out: Path, keys: list[str]) -> bool:
    """Each key's file under ``out`` holds its body."""
    return all((out / key.removeprefix("d/")).read_bytes() == body_of(key) for key in keys)

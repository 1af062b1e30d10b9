"""A plain HTTP file server on 127.0.0.1, for the http(s):// source: what nginx, a release page
or a presigned URL behave like, with the knobs a test needs.

* ``files`` — URL path → body; ``put(path, body)`` replaces one (its ETag changes with it);
* ``ranges`` — serve ``Range`` requests with 206 and ``Content-Range`` (else always a 200);
* ``etags`` — send a strong ETag and honour ``If-Match`` (412 when it no longer matches);
* ``required`` — headers every request must carry (else 401), e.g. an Authorization header;
* ``redirects`` — URL path → absolute URL answered with a 302.

``requests`` records (method, path with query, headers) of every request; ``body_bytes`` counts
the body bytes sent.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")
LAST_MODIFIED = "Tue, 01 Dec 2026 10:00:00 GMT"


class FileServer:
    def __init__(self, *, ranges: bool = True, etags: bool = True) -> None:
        self.files: dict[str, bytes] = {}
        self.ranges = ranges
        self.etags = etags
        self.required: dict[str, str] = {}
        self.redirects: dict[str, str] = {}
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.body_bytes = 0
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def put(self, path: str, body: bytes) -> str:
        self.files[path] = body
        return self.url + path

    def start(self) -> FileServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def gets(self, path: str) -> list[dict[str, str]]:
        """The headers of every GET of ``path`` (query ignored)."""
        return [h for m, p, h in self.requests if m == "GET" and urlsplit(p).path == path]

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_HEAD(self) -> None:
                self._answer(send_body=False)

            def do_GET(self) -> None:
                self._answer(send_body=True)

            def _answer(self, send_body: bool) -> None:
                with server._lock:
                    server.requests.append((self.command, self.path, dict(self.headers)))
                path = urlsplit(self.path).path
                if path in server.redirects:
                    return self._empty(302, {"Location": server.redirects[path]})
                for name, value in server.required.items():
                    if self.headers.get(name) != value:
                        return self._empty(401)
                body = server.files.get(path)
                if body is None:
                    return self._empty(404)
                etag = '"' + hashlib.sha256(body).hexdigest()[:16] + '"'
                if server.etags and self.headers.get("If-Match") not in (None, etag):
                    return self._empty(412)
                status, start, end = 200, 0, len(body)
                wanted = _RANGE.match(self.headers.get("Range", ""))
                if server.ranges and wanted:
                    start = int(wanted[1])
                    end = min(len(body), int(wanted[2]) + 1 if wanted[2] else len(body))
                    if start >= len(body):
                        return self._empty(416, {"Content-Range": f"bytes */{len(body)}"})
                    status = 206
                headers = {"Content-Length": str(end - start), "Last-Modified": LAST_MODIFIED}
                if status == 206:
                    headers["Content-Range"] = f"bytes {start}-{end - 1}/{len(body)}"
                if server.ranges:
                    headers["Accept-Ranges"] = "bytes"
                if server.etags:
                    headers["ETag"] = etag
                self._head(status, headers)
                if send_body:
                    self.wfile.write(body[start:end])
                    with server._lock:
                        server.body_bytes += end - start

            def _head(self, status: int, headers: dict[str, str]) -> None:
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()

            def _empty(self, status: int, headers: dict[str, str] | None = None) -> None:
                self._head(status, {**(headers or {}), "Content-Length": "0"})

        return Handler


@contextmanager
def file_server(**options: bool) -> Iterator[FileServer]:
    server = FileServer(**options).start()
    try:
        yield server
    finally:
        server.stop()

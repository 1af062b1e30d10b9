"""A native response's headers, as the engine reads them: by name in any case, repeated ones
joined as urllib3 joins them, copied out of the client on the loop and on a worker thread."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from initializers.native import NativeHttp

BODY = b"twelve bytes"


class _Answer(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(BODY)))
        self.send_header("ETag", '"abc"')
        self.send_header("X-Goog-Hash", "crc32c=AAAAAA==")
        self.send_header("X-Goog-Hash", "md5=BBBBBBBBBBBBBBBBBBBBBB==")
        self.end_headers()
        self.wfile.write(BODY)

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def _server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def _read_as_the_engine_does(headers) -> dict[str, object]:
    return {
        "etag": headers.get("ETag"),
        "same in any case": headers.get("etag") == headers.get("ETAG") == headers["Etag"],
        "hashes": headers.get("x-goog-hash"),
        "length": headers["content-length"],
        "has it": "Content-Length" in headers and "x-absent" not in headers,
        "default": headers.get("X-Absent", "none"),
    }


EXPECTED = {
    "etag": '"abc"',
    "same in any case": True,
    "hashes": "crc32c=AAAAAA==, md5=BBBBBBBBBBBBBBBBBBBBBB==",
    "length": str(len(BODY)),
    "has it": True,
    "default": "none",
}


def test_a_whole_files_headers_on_the_loop_are_read_by_name_in_any_case_repeats_joined():
    async def fetch(base: str) -> tuple[dict[str, object], bytes]:
        native = NativeHttp(base, headers={}, timeout=10)
        async with native.get_whole("/f", len(BODY), "f") as response:
            body = b"".join([bytes(chunk) async for chunk in response.chunks()])
            return _read_as_the_engine_does(response.headers), body

    with _server() as base:
        seen, body = asyncio.run(fetch(base))
    assert seen == EXPECTED and body == BODY


def test_a_ranges_headers_on_a_worker_thread_are_read_the_same_way():
    with _server() as base:
        native = NativeHttp(base, headers={}, timeout=10)
        reader = native.open_range("/f", 0, len(BODY), "f", whole=True)
        try:
            seen = _read_as_the_engine_does(reader.headers)
            body = b"".join(bytes(chunk) for chunk in reader.chunks())
        finally:
            reader.close()
    assert seen == EXPECTED and body == BODY

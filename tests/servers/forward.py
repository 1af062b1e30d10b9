"""An HTTP forward proxy on 127.0.0.1 that sends every request, whatever host it names, to one
upstream server on 127.0.0.1, its Host header unchanged.

How a test reaches a virtual-hosted bucket (``http://bucket.s3.test:PORT/key``) without DNS:
point ``HTTP_PROXY`` at it, and the client asks it for the absolute URL; the upstream (moto's
server) reads the bucket from the Host header. Nothing leaves the machine: the named host is
never resolved. ``requests`` holds (method, Host, path) of every request, in order.
"""

from __future__ import annotations

import http.client
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

_HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "proxy-authorization", "te"}


class ForwardProxy:
    def __init__(self, upstream_port: int) -> None:
        self.requests: list[tuple[str, str, str]] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _forward(self) -> None:
                target = urlsplit(self.path)
                path = target.path + (f"?{target.query}" if target.query else "")
                host = self.headers.get("Host", target.netloc)
                owner.requests.append((self.command, host, path))
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
                upstream = http.client.HTTPConnection("127.0.0.1", upstream_port, timeout=60)
                try:
                    upstream.request(self.command, path, body or None, headers)
                    answer = upstream.getresponse()
                    data = answer.read()
                finally:
                    upstream.close()
                self.send_response(answer.status)
                for name, value in answer.getheaders():
                    if name.lower() not in _HOP_BY_HOP | {"transfer-encoding", "content-length"}:
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

"""A forked worker never reads from a connection its parent kept alive.

Both would: the parent goes on listing on its pooled connection while the child sends its own
requests, and two processes on one socket read each other's responses."""

from __future__ import annotations

import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from initializers.transport import HttpTransport


class _Peers(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: ThreadingHTTPServer

    def do_GET(self) -> None:
        body = f"{self.client_address[1]}".encode()  # the client's port: its connection
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_a_forked_child_opens_its_own_connection_and_the_parent_keeps_its_own():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Peers)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    transport = HttpTransport(connections=4, timeout=10)
    try:
        parent_port = transport.request("GET", url, {}, "probe")[2]
        assert transport.request("GET", url, {}, "probe")[2] == parent_port  # kept alive
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: one request, its connection's port to the parent
            try:
                os.write(write, transport.request("GET", url, {}, "probe")[2])
            finally:
                os._exit(0)
        os.close(write)
        with os.fdopen(read, "rb") as answer:
            child_port = answer.read()
        assert os.waitpid(pid, 0)[1] == 0
        assert child_port and child_port != parent_port
        assert transport.request("GET", url, {}, "probe")[2] == parent_port
    finally:
        transport.close()
        server.shutdown()

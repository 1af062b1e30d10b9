"""An OAuth2 token endpoint on 127.0.0.1 (Google's or Microsoft Entra's, as far as a client
sees them): records each form POSTed and answers with the token ``issue(form)`` returns, or
with 400 ``invalid_grant`` when it returns None."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs

Issuer = Callable[[dict[str, str]], str | None]


class TokenServer:
    def __init__(self, issue: Issuer) -> None:
        self.forms: list[dict[str, str]] = []
        self.paths: list[str] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers["Content-Length"])).decode()
                form = {k: v[0] for k, v in parse_qs(raw).items()}
                server.forms.append(form)
                server.paths.append(self.path)
                token = issue(form)
                if token is None:
                    status, answer = 400, {"error": "invalid_grant", "error_description": "no"}
                else:
                    status, answer = 200, {"access_token": token, "expires_in": 3600}
                body = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

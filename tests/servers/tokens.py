"""An OAuth2 token endpoint on 127.0.0.1 (Google's or Microsoft Entra's, as far as a client
sees them): records each form POSTed and answers with the token ``issue(form)`` returns, or
with 400 ``invalid_grant`` when it returns None.

For msal (azure-identity's Entra client), which takes only an https authority and reads its
OpenID configuration first: ``https=True`` serves TLS with a fresh self-signed certificate
(``ca_file``) and answers ``GET /<tenant>/v2.0/.well-known/openid-configuration``. It also
stands in for a managed identity endpoint as App Service serves one
(``IDENTITY_ENDPOINT`` = ``url + "/msi/token"``, ``IDENTITY_HEADER`` = ``identity_header``):
and for the instance metadata service (its path, under ``AZURE_POD_IDENTITY_AUTHORITY_HOST`` =
``url``): each GET there is recorded in ``identity_requests`` and answered with ``issue`` of its
query.
"""

from __future__ import annotations

import json
import ssl
import tempfile
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from tests.servers.tls import ca_signed

Issuer = Callable[[dict[str, str]], str | None]
OPENID = "/v2.0/.well-known/openid-configuration"
IMDS = "/metadata/identity/oauth2/token"  # the instance metadata service's path


class TokenServer:
    def __init__(self, issue: Issuer, https: bool = False) -> None:
        self.forms: list[dict[str, str]] = []
        self.paths: list[str] = []
        self.identity_requests: list[dict[str, str]] = []
        self.identity_header = "identity-header-secret-5d2a"
        self.ca_file: Path | None = None
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers["Content-Length"])).decode()
                form = {k: v[0] for k, v in parse_qs(raw).items()}
                server.forms.append(form)
                server.paths.append(urlsplit(self.path).path)
                token = issue(form)
                if token is None:
                    refusal = "AADSTS7000215: Invalid client secret provided."  # as Entra says it
                    self._json(400, {"error": "invalid_grant", "error_description": refusal})
                else:
                    self._json(200, {"access_token": token, "expires_in": 3600})

            def do_GET(self) -> None:
                url = urlsplit(self.path)
                if url.path.endswith(OPENID):
                    self._json(200, server.openid_configuration(url.path.split("/")[1]))
                elif url.path in ("/msi/token", IMDS):
                    query = {k: v[0] for k, v in parse_qs(url.query).items()}
                    server.identity_requests.append(query | {"path": url.path})
                    token = issue(query)
                    if url.path == IMDS:
                        proven = self.headers.get("Metadata") == "true"
                    else:
                        proven = self.headers.get("X-IDENTITY-HEADER") == server.identity_header
                    if not proven or not token:
                        self._json(401, {"error": "unauthorized_client"})
                        return
                    expires = str(int(time.time()) + 3600)
                    answer = {"access_token": token, "expires_on": expires, "expires_in": "3600"}
                    answer["token_type"] = "Bearer"
                    self._json(200, answer | {"resource": query.get("resource", "")})
                else:
                    self._json(404, {"error": "not_found"})

            def _json(self, status: int, answer: dict[str, object]) -> None:
                body = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        if https:
            folder = Path(tempfile.mkdtemp(prefix="token-server-"))
            # Signed by a CA of its own (not self-signed for 127.0.0.1, as Azurite's is): a
            # bundle of both then holds two issuers of different names, and each is found.
            self.ca_file, cert, key = folder / "ca.pem", folder / "cert.pem", folder / "key.pem"
            ca_signed(self.ca_file, cert, key)
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(cert, key)
            self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        scheme = "https" if https else "http"
        self.url = f"{scheme}://127.0.0.1:{self._server.server_address[1]}"

    def openid_configuration(self, tenant: str) -> dict[str, object]:
        base = f"{self.url}/{tenant}"
        return {
            "issuer": f"{base}/v2.0",
            "token_endpoint": f"{base}/oauth2/v2.0/token",
            "authorization_endpoint": f"{base}/oauth2/v2.0/authorize",
            "device_authorization_endpoint": f"{base}/oauth2/v2.0/devicecode",
        }

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

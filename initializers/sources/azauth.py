"""Azure Blob credentials: Shared Key request signing, and Microsoft Entra tokens.

Shared Key (an account key, from the env or a connection string) signs each request with
HMAC-SHA256 over its method, standard headers, ``x-ms-*`` headers and canonical resource, as
the Blob service documents. Entra ID tokens for ``https://storage.azure.com`` come from the
OAuth2 client-credentials grant: with a service principal's secret, or with the AKS workload
identity's federated token file (re-read at every refresh, since the kubelet rotates it). Both
flows are two form POSTs; azure-identity (with msal and its dependencies) would add several
megabytes to the image for them. A token is refreshed five minutes before it expires.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
import time
from collections.abc import Mapping
from email.utils import formatdate
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit

from initializers.errors import AuthError, TransientError, UsageError
from initializers.httpstatus import is_transient
from initializers.transport import HttpTransport

API_VERSION = "2021-08-06"  # bearer tokens need 2017-11-09 or later
SCOPE = "https://storage.azure.com/.default"
DEFAULT_AUTHORITY = "https://login.microsoftonline.com"
# Only these standard headers are signed, in this order (the Date slot stays empty: x-ms-date).
_SIGNED = (
    "content-encoding",
    "content-language",
    "content-length",
    "content-md5",
    "content-type",
    "date",
    "if-modified-since",
    "if-match",
    "if-none-match",
    "if-unmodified-since",
    "range",
)


class SharedKey:
    """Signs Blob service requests with an account key."""

    def __init__(self, account: str, key: str) -> None:
        try:
            self._key = base64.b64decode(key, validate=True)
        except ValueError:
            raise UsageError(
                "the Azure storage account key is not valid base64; copy it again from the "
                "storage account's access keys"
            ) from None
        self._account = account

    def headers(self, method: str, url: str, headers: Mapping[str, str]) -> dict[str, str]:
        """``headers`` plus ``x-ms-date`` and the ``Authorization`` that signs them."""
        signed = {**headers, "x-ms-date": formatdate(usegmt=True)}
        lower = {name.lower(): value for name, value in signed.items()}
        if lower.get("content-length") == "0":
            lower["content-length"] = ""
        standard = [lower.get(name, "") for name in _SIGNED]
        ms = "".join(f"{n}:{lower[n].strip()}\n" for n in sorted(lower) if n.startswith("x-ms-"))
        parts = urlsplit(url)
        resource = f"/{self._account}{parts.path}"
        query: dict[str, list[str]] = {}
        for name, value in parse_qsl(parts.query, keep_blank_values=True):
            query.setdefault(name.lower(), []).append(value)
        for name in sorted(query):
            resource += f"\n{name}:{','.join(sorted(query[name]))}"
        text = "\n".join([method, *standard]) + "\n" + ms + resource
        digest = hmac.new(self._key, text.encode(), hashlib.sha256).digest()
        signed["Authorization"] = f"SharedKey {self._account}:{base64.b64encode(digest).decode()}"
        return signed


class EntraToken:
    """A bearer token for Azure Storage from the client-credentials grant."""

    def __init__(
        self,
        transport: HttpTransport,
        *,
        tenant: str,
        client_id: str,
        secret: str | None = None,
        federated_token_file: Path | None = None,
        authority: str | None = None,
    ) -> None:
        self._transport = transport
        self._url = f"{(authority or DEFAULT_AUTHORITY).rstrip('/')}/{tenant}/oauth2/v2.0/token"
        self._client_id = client_id
        self._secret = secret
        self._token_file = federated_token_file
        self._token = ""
        self._expires = 0.0
        self._lock = threading.Lock()

    def headers(self, method: str, url: str, headers: Mapping[str, str]) -> dict[str, str]:
        return {**headers, "Authorization": f"Bearer {self._current()}"}

    def _current(self) -> str:
        with self._lock:
            if time.monotonic() > self._expires - 300:
                self._refresh()
            return self._token

    def _refresh(self) -> None:
        form = {"grant_type": "client_credentials", "client_id": self._client_id, "scope": SCOPE}
        if self._token_file is not None:
            try:
                assertion = self._token_file.read_text().strip()
            except OSError as exc:
                raise AuthError(
                    f"cannot read AZURE_FEDERATED_TOKEN_FILE {self._token_file}: {exc.strerror}; "
                    "check the pod's azure.workload.identity/use label and service account"
                ) from None
            form["client_assertion"] = assertion
            form["client_assertion_type"] = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
        else:
            form["client_secret"] = self._secret or ""
        status, _, body = self._transport.request(
            "POST",
            self._url,
            {"Content-Type": "application/x-www-form-urlencoded"},
            "Azure credentials",
            body=urlencode(form).encode(),
        )
        if is_transient(status):
            raise TransientError(f"Azure credentials: HTTP {status} from the token endpoint")
        try:
            answer = json.loads(body)
        except ValueError:
            answer = {}
        if status != 200 or "access_token" not in answer:
            code = str(answer.get("error", f"HTTP {status}"))[:80]
            raise AuthError(
                f"cannot get an Azure Storage token ({code}); check AZURE_TENANT_ID, "
                "AZURE_CLIENT_ID and the client secret or workload identity federation"
            )
        self._token = str(answer["access_token"])
        self._expires = time.monotonic() + float(answer.get("expires_in", 3600))

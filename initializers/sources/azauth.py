"""Azure Blob Shared Key request signing (Entra tokens: :mod:`~.azidentity`).

Shared Key (an account key, from the env or a connection string) signs each request with
HMAC-SHA256 over its method, standard headers, ``x-ms-*`` headers and canonical resource, as
the Blob service documents.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Mapping
from email.utils import formatdate
from urllib.parse import parse_qsl, urlsplit

from initializers.errors import UsageError

API_VERSION = "2021-08-06"  # bearer tokens need 2017-11-09 or later
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

"""SigV4 header signatures for S3 requests: AWS's published algorithm on hashlib and hmac.

Why not a library: awscrt's native signer (used here before) signs in ~17 µs, but loading
``_awscrt`` cost 27-36 ms of every run's start, before its first request (``-X importtime``;
the issue's budget for the first data GET is 250 ms); botocore's signer costs ~0.4 s to import.
This one signs in ~9 µs: the signing key is derived once per day, region and secret, leaving
one SHA-256 and one HMAC per request. ``tests/test_s3_signing.py`` holds it to botocore's
signature, byte for byte, for every key shape, token and query this project sends.

Headers are signed, not the URL: urllib3 re-encodes a request's URL one character at a time,
which cost ~0.2 ms a request on a presigned URL's long query string.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, unquote

UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"  # S3 accepts it on any request without a body


class S3HeaderSigner:
    """Signs requests for one region with botocore's (possibly refreshing) credentials, or
    static ones of the same shape."""

    def __init__(self, credentials: Any, region: str) -> None:
        self._credentials = credentials
        self._region = region
        self._key: tuple[tuple[str, str], bytes] | None = None  # (secret, date) -> signing key

    def _signing_key(self, secret: str, day: str) -> bytes:
        cached = self._key
        if cached is None or cached[0] != (secret, day):
            key = f"AWS4{secret}".encode()
            for part in (day, self._region, "s3", "aws4_request"):
                key = hmac.digest(key, part.encode(), "sha256")
            cached = self._key = ((secret, day), key)
        return cached[1]

    def sign(
        self,
        host: str,
        path: str,
        headers: Mapping[str, str],
        now: datetime.datetime | None = None,
        method: str = "GET",
    ) -> dict[str, str]:
        """``headers`` plus X-Amz-Date, x-amz-content-sha256, the session token and
        Authorization for ``method path`` (a GET unless told; ``path`` may carry a query) on
        ``host`` (the Host header the client will send).

        Every header given is signed, so pass the x-amz-* ones here and add unsigned ones
        (Range, If-Match) afterwards. ``path`` is the URI-encoded path S3 receives; S3 signs it
        as sent (no double encoding, no normalisation).
        """
        frozen = self._credentials.get_frozen_credentials()
        stamp = (now or datetime.datetime.now(datetime.UTC)).strftime("%Y%m%dT%H%M%SZ")
        day = stamp[:8]
        signed = dict(headers)
        signed["X-Amz-Date"] = stamp
        signed["x-amz-content-sha256"] = UNSIGNED_PAYLOAD
        if frozen.token:
            signed["X-Amz-Security-Token"] = frozen.token
        canonical = {"host": host.strip()}
        canonical.update((name.lower(), " ".join(value.split())) for name, value in signed.items())
        names = sorted(canonical)
        uri, _, query = path.partition("?")
        request = "\n".join(
            (
                method,
                uri or "/",
                _canonical_query(query),
                "".join(f"{name}:{canonical[name]}\n" for name in names),
                ";".join(names),
                UNSIGNED_PAYLOAD,
            )
        )
        scope = f"{day}/{self._region}/s3/aws4_request"
        to_sign = "\n".join(
            ("AWS4-HMAC-SHA256", stamp, scope, hashlib.sha256(request.encode()).hexdigest())
        )
        signature = hmac.new(
            self._signing_key(frozen.secret_key, day), to_sign.encode(), "sha256"
        ).hexdigest()
        signed["Authorization"] = (
            f"AWS4-HMAC-SHA256 Credential={frozen.access_key}/{scope}, "
            f"SignedHeaders={';'.join(names)}, Signature={signature}"
        )
        return signed


def _canonical_query(query: str) -> str:
    """The query's parameters sorted, each name and value encoded as SigV4 asks (every byte
    but ``A-Za-z0-9-_.~`` as %XX), whatever encoding the caller sent them in."""
    pairs = []
    for pair in query.split("&") if query else ():
        name, _, value = pair.partition("=")
        pairs.append((_encode(unquote(name)), _encode(unquote(value))))
    return "&".join(f"{name}={value}" for name, value in sorted(pairs))


def _encode(text: str) -> str:
    return quote(text, safe="-_.~")

"""SigV4 header signatures for S3 requests, computed by awscrt's native signer.

Measured on the benchmark machine, per request: ~17 µs here against ~85 µs for botocore's
presigner. Header signing also keeps the URL short: urllib3 re-encodes a request's URL one
character at a time, which cost ~0.2 ms a request on a presigned URL's long query string — more
than the rest of the request on a dataset of small files.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

from awscrt import auth as crt_auth
from awscrt import http as crt_http


class S3HeaderSigner:
    """Signs requests for one region with botocore's (possibly refreshing) credentials, or
    static ones of the same shape."""

    def __init__(self, credentials: Any, region: str) -> None:
        self._credentials = credentials
        self._region = region
        self._provider: tuple[Any, crt_auth.AwsCredentialsProvider] | None = None

    def _provider_for(self, frozen: Any) -> crt_auth.AwsCredentialsProvider:
        """A static provider for the current credentials, rebuilt when botocore refreshes them."""
        cached = self._provider
        if cached is None or cached[0] != frozen:
            provider = crt_auth.AwsCredentialsProvider.new_static(
                frozen.access_key, frozen.secret_key, frozen.token
            )
            cached = self._provider = (frozen, provider)
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
        provider = self._provider_for(self._credentials.get_frozen_credentials())
        config = crt_auth.AwsSigningConfig(
            algorithm=crt_auth.AwsSigningAlgorithm.V4,
            signature_type=crt_auth.AwsSignatureType.HTTP_REQUEST_HEADERS,
            credentials_provider=provider,
            region=self._region,
            service="s3",
            date=now,
            use_double_uri_encode=False,
            should_normalize_uri_path=False,
            signed_body_value=crt_auth.AwsSignedBodyValue.UNSIGNED_PAYLOAD,
            signed_body_header_type=crt_auth.AwsSignedBodyHeaderType.X_AMZ_CONTENT_SHA_256,
        )
        request = crt_http.HttpRequest(
            method, path, crt_http.HttpHeaders([("Host", host), *headers.items()])
        )
        crt_auth.aws_sign_request(request, config).result()
        return {name: value for name, value in request.headers if name.lower() != "host"}

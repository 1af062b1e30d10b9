"""What an S3 error means, for both ways this project talks to S3 (botocore, signed REST)."""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import SplitResult

from initializers.errors import AuthError, NotFoundError, UsageError
from initializers.httpstatus import is_transient, transient

_AUTH_CODES = {
    "AccessDenied",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "InvalidToken",
    "TokenRefreshRequired",
    "AllAccessDisabled",
    "403",
    "401",
}
_TRANSIENT_CODES = {
    "SlowDown",
    "InternalError",
    "ServiceUnavailable",
    "RequestTimeout",
    "Throttling",
    "ThrottlingException",
    "RequestTimeTooSkewed",
}


def s3_error(
    code: str, status: int, headers: Mapping[str, str], where: str, bucket: str
) -> Exception:
    """The typed error an S3 error ``code`` (or, without one, the HTTP ``status``) means."""
    numeric = int(code) if code.isdigit() else status  # botocore names some errors by status
    if code in _TRANSIENT_CODES or is_transient(numeric) or is_transient(status):
        return transient(f"{where}: S3 said {code or status}", headers)
    if code in ("NoSuchBucket",):
        return NotFoundError(
            f"{where}: bucket {bucket!r} does not exist — check its name and the endpoint/region"
        )
    if code in ("NoSuchKey", "404", "NotFound"):
        failure = NotFoundError(f"{where}: no such object")
    elif code in _AUTH_CODES or status in (401, 403):
        failure = AuthError(
            f"{where}: access denied ({code or status}); check the credentials "
            "(ACCESS_KEY_ID / SECRET_ACCESS_KEY, ROLE_ARN) and the bucket policy"
        )
    elif code in ("PermanentRedirect", "301", "AuthorizationHeaderMalformed"):
        failure = UsageError(
            f"{where}: the bucket is in another region "
            f"({headers.get('x-amz-bucket-region', 'unknown')}); set --region "
            "or leave it at 'auto'"
        )
    else:
        return UsageError(f"{where}: S3 refused the request ({code or status})")
    failure.bucket_region = headers.get("x-amz-bucket-region")  # type: ignore[attr-defined]
    return failure


def host_header(url: SplitResult) -> str:
    """The Host header an HTTP client sends for ``url`` (no port when it is the default)."""
    host = url.hostname or ""
    host = f"[{host}]" if ":" in host else host
    default = {"http": 80, "https": 443}.get(url.scheme)
    return host if url.port in (None, default) else f"{host}:{url.port}"

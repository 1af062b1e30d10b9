"""What an HTTP status means, once for every byte path (urllib3's and the native one)."""

from __future__ import annotations

from collections.abc import Mapping

from initializers.errors import (
    AuthError,
    InitializerError,
    IntegrityError,
    NotFoundError,
    TransientError,
)

TRANSIENT_STATUSES = frozenset({408, 429, 500, 502, 503, 504})


def status_error(status: int, what: str) -> InitializerError | None:
    """The typed error HTTP ``status`` means for ``what``; None for 2xx."""
    if 200 <= status < 300:
        return None
    if status in TRANSIENT_STATUSES:
        return TransientError(f"{what}: HTTP {status}")
    if status in (401, 403):
        return AuthError(
            f"{what}: access denied (HTTP {status}); check the credentials and "
            "that they grant read access"
        )
    if status == 404:
        return NotFoundError(
            f"{what}: not found (HTTP 404); it may have been deleted or renamed since it was listed"
        )
    if status == 412:
        return IntegrityError(
            f"{what}: changed on the server while it was being fetched; "
            "rerun to fetch the new version"
        )
    if status == 416:
        return IntegrityError(f"{what}: the server no longer has the bytes it listed; rerun")
    return InitializerError(f"{what}: unexpected HTTP {status} from the server")


def check_status(status: int, what: str, headers: Mapping[str, str] | None = None) -> None:
    """Raise the typed error an HTTP status means for ``what``; return on 2xx."""
    failure = status_error(status, what)
    if failure is not None:
        raise failure

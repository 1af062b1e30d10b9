"""What an HTTP response means, once for every byte path (urllib3's and the native one): its
status, how long a throttled answer asks to wait, and for a ranged GET whether its bytes are
the range asked for."""

from __future__ import annotations

import email.utils
import re
from collections.abc import Mapping
from datetime import UTC, datetime

from initializers.errors import (
    AuthError,
    InitializerError,
    IntegrityError,
    NotFoundError,
    TransientError,
)

_PERMANENT_5XX = frozenset({501, 505})  # not implemented, version not supported: never better


def is_transient(status: int) -> bool:
    """The one rule for which HTTP statuses are worth retrying, for every source: a timeout,
    throttling, and server errors (including a CDN's 52x) but those that cannot get better."""
    return status in (408, 429) or (status >= 500 and status not in _PERMANENT_5XX)


def retry_after(headers: Mapping[str, str] | None) -> float | None:
    """The seconds a ``Retry-After`` header asks to wait (a number of seconds or an HTTP date),
    None without one or with one that is neither."""
    if not headers:
        return None
    value = (headers.get("Retry-After") or headers.get("retry-after") or "").strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def transient(message: str, headers: Mapping[str, str] | None = None) -> TransientError:
    """A retryable failure, carrying the wait its answer's ``Retry-After`` asked for."""
    wait = retry_after(headers)
    if wait is not None:
        message = f"{message} (asked to retry after {wait:.0f}s)"
    return TransientError(message, retry_after=wait)


def status_error(
    status: int, what: str, headers: Mapping[str, str] | None = None
) -> InitializerError | TransientError | None:
    """The typed error HTTP ``status`` means for ``what``; None for 2xx."""
    if 200 <= status < 300:
        return None
    if is_transient(status):
        return transient(f"{what}: HTTP {status}", headers)
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
    failure = status_error(status, what, headers)
    if failure is not None:
        raise failure


def range_value(start: int, end: int) -> str:
    """The ``Range`` header for bytes ``[start, end)`` (a source that signs it needs it first)."""
    return f"bytes={start}-{end - 1}"


_CONTENT_RANGE = re.compile(r"^\s*bytes\s+(\d+)-(\d+)/(?:\d+|\*)\s*$", re.IGNORECASE)


def check_answer(
    status: int, headers: Mapping[str, str], start: int, end: int, whole: bool, what: str
) -> None:
    """Raise unless a GET of bytes ``[start, end)`` was answered with them: its status, and
    for a ranged GET (not ``whole``) the range the server says it sent."""
    check_status(status, what, headers)
    if not whole:
        check_range(status, headers, start, end, what)


def check_range(status: int, headers: Mapping[str, str], start: int, end: int, what: str) -> None:
    """Raise unless the body of a ranged GET starts at ``start`` and covers up to ``end``.

    The ``Content-Range`` header is what says where the bytes belong, whatever the status: some
    S3-compatible servers (rclone's) answer a range with 200 and a correct ``Content-Range``,
    while a 200 without one from ``start`` > 0 means the server sent the whole file instead.
    """
    found = _CONTENT_RANGE.match(headers.get("Content-Range", ""))
    if found is None:
        if status == 206 or start != 0:
            raise IntegrityError(
                f"{what}: the server ignored the byte range it was asked for"
                if status == 200
                else f"{what}: the server answered a byte range without a valid Content-Range"
            )
        return  # a 200 with the whole file: its first bytes are the range asked for
    first, last = int(found[1]), int(found[2])
    if first != start or last < end - 1:
        raise IntegrityError(
            f"{what}: the server sent bytes {first}-{last} when asked for {start}-{end - 1}"
        )

"""Typed failures and the exit codes they map to.

Every expected failure is one of these classes. Code deep in the engine or a source raises them
with a message that names the problem *and* the fix; only the CLI edge (``initializers.cli``) turns
them into an exit code, one line on stderr and the termination message. Messages must never carry
a secret: build them from URIs, paths and status codes, never from headers or credentials.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """Documented process exit codes (README, "Exit codes")."""

    OK = 0
    UNEXPECTED = 1
    USAGE = 2
    AUTH = 3
    NOT_FOUND = 4
    INTEGRITY = 5
    LOCAL_STORAGE = 6
    UNAVAILABLE = 7
    INTERRUPTED = 143  # SIGTERM/SIGINT: stopped cleanly, rerun resumes


# What each code means and what typically causes it: the docs' exit-code tables are made from it.
EXIT_MEANINGS: dict[ExitCode, tuple[str, str]] = {
    ExitCode.OK: ("complete", ""),
    ExitCode.UNEXPECTED: ("unexpected (a bug: please report it with `--debug` output)", ""),
    ExitCode.USAGE: (
        "usage or configuration",
        "bad URI, unknown scheme, bad pattern, conflicting flags",
    ),
    ExitCode.AUTH: (
        "authentication or permission",
        "no S3 credentials, access denied, gated repo without access",
    ),
    ExitCode.NOT_FOUND: (
        "not found",
        "bucket, prefix with no objects, repo, revision, path, patterns matching nothing",
    ),
    ExitCode.INTEGRITY: ("integrity", "checksum or size mismatch, twice"),
    ExitCode.LOCAL_STORAGE: (
        "local storage",
        "destination not writable, disk full, a symlink planted in the way",
    ),
    ExitCode.UNAVAILABLE: ("remote unavailable after retries", "endpoint down, persistent 5xx"),
    ExitCode.INTERRUPTED: ("stopped by SIGTERM/SIGINT", "rerun to resume"),
}


class InitializerError(Exception):
    """Base of every expected failure; ``exit_code`` says how the process ends."""

    exit_code: ExitCode = ExitCode.UNEXPECTED


class UsageError(InitializerError):
    """Bad URI, unknown scheme, bad pattern, conflicting or invalid flags."""

    exit_code = ExitCode.USAGE


class AuthError(InitializerError):
    """Missing, wrong or insufficient credentials (401/403, gated repo, expired token)."""

    exit_code = ExitCode.AUTH


class NotFoundError(InitializerError):
    """The bucket, prefix, repository, revision or path does not exist (or holds nothing)."""

    exit_code = ExitCode.NOT_FOUND


class IntegrityError(InitializerError):
    """Bytes fetched do not match the size or checksum the source announced."""

    exit_code = ExitCode.INTEGRITY


class LocalStorageError(InitializerError):
    """The destination cannot be written: permissions, disk full, unsafe path."""

    exit_code = ExitCode.LOCAL_STORAGE


class UnavailableError(InitializerError):
    """The remote kept failing with transient errors until the retry budget ran out."""

    exit_code = ExitCode.UNAVAILABLE


class TransientError(Exception):
    """A failure worth retrying (reset, timeout, 5xx, throttling, short body).

    Raised by sources; the engine retries it and, once the retry budget is spent, turns it into
    :class:`UnavailableError`. ``retry_after``: the seconds the server asked to wait before the
    next attempt (an HTTP ``Retry-After``), when it did.
    """

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class Interrupted(InitializerError):
    """The run was stopped by a signal; everything fetched so far is kept for a rerun."""

    exit_code = ExitCode.INTERRUPTED


STOPPED = "stopped by a signal; rerun to resume (fetched bytes are kept)"


class TlsRefused(UsageError):
    """The endpoint's certificate (or its TLS) was refused, by whichever client."""


def tls_refused(what: str, variable: str | None = None) -> str:
    """The one line for a server certificate a client refused, whichever client: the fix is the
    endpoint's CA (``--ca-bundle``, or the environment ``variable`` the SDKs read too) or
    plain HTTP."""
    also = f" (or {variable})" if variable else ""
    return (
        f"{what}: TLS verification failed; pass --ca-bundle{also} with the endpoint's CA, "
        "or use its http:// URL"
    )


def unloadable_ca_bundle(ca_bundle: str) -> str:
    """The one message for a ``--ca-bundle`` file with no certificate in it, whichever client
    reads it."""
    return (
        f"the CA bundle {ca_bundle} holds no certificate OpenSSL can load; "
        "pass a PEM file of CA certificates"
    )

"""The native byte path: HTTP GETs made in Rust by obstore (Apache Arrow's ``object_store``).

Why: on a dataset of many small files the urllib3 path spends about 1.5 ms of interpreter time
per file building the request and parsing the response, and the engine's threads take turns
under the GIL for it. Here the request, the redirects, the connection pool and the body all live
in Rust; Python hands over a path and gets the body back. Measured on the benchmark machine
(2 cores, the benchmark's 2,002 files from nginx, 16 threads, verification and fsync on), the
fetch took a third of the CPU of the urllib3 path.

How: one asyncio loop thread per process drives obstore's async calls; a worker thread submits a
call and waits for it in short slices, so a stop (SIGTERM, through
:func:`initializers.interrupts.interrupt_reads`) cancels every request in flight at once —
dropping a Rust future closes its connection — and refuses any request that would start after.
Stalls end at ``read_timeout`` (the gap between two reads), not at a total request time, so a
large range may take as long as it needs. Failures are classified here, once, into the typed
errors of :mod:`initializers.errors`, by the status rules of :mod:`initializers.httpstatus`;
messages name the file, never the URL.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import re
import threading
import urllib.request
from collections.abc import Awaitable, Callable, Iterator, Mapping
from datetime import timedelta
from typing import Any, TypeVar
from urllib.parse import urlsplit

import obstore
from obstore import exceptions as native_errors
from obstore.store import HTTPStore

from initializers.errors import (
    InitializerError,
    IntegrityError,
    TransientError,
    UsageError,
)
from initializers.httpstatus import status_error
from initializers.interrupts import on_interrupt
from initializers.streams import RangeReader

CHUNK_SIZE = 1 << 20
WHOLE_BODY = CHUNK_SIZE  # up to this size a response comes back in one call (a cut loses no more)
CONNECT_TIMEOUT = 10.0
WAIT_SLICE = 0.2  # seconds a waiting worker sleeps between looks at the stop flag
REQUEST_LIMIT = timedelta(days=1)  # stalls are caught by the read timeout, not by this

T = TypeVar("T")

# Set once by the first interrupt, never cleared: a stop is final (a plain flag, as the signal
# handler that sets it must take no lock).
_stopped = False
_loop_lock = threading.Lock()
_loop: tuple[int, asyncio.AbstractEventLoop] | None = None  # (pid, loop): a fork starts anew


@on_interrupt
def cancel_requests() -> None:
    """Cancel every native request in flight and refuse new ones (called on SIGTERM)."""
    global _stopped
    _stopped = True


def _running_loop() -> asyncio.AbstractEventLoop:
    """This process's loop thread, started on first use (so after any fork)."""
    global _loop
    with _loop_lock:
        if _loop is None or _loop[0] != os.getpid():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="native", daemon=True).start()
            _loop = (os.getpid(), loop)
        return _loop[1]


def _stopped_error(what: str) -> TransientError:
    return TransientError(f"{what}: stopped")


def _call(make: Callable[[], Awaitable[T]], what: str) -> T:
    """Run ``make()`` on the loop thread and wait for it, giving up at once on a stop."""
    if _stopped:
        raise _stopped_error(what)

    async def run() -> T:
        return await make()

    future = asyncio.run_coroutine_threadsafe(run(), _running_loop())
    while True:
        try:
            return future.result(WAIT_SLICE)
        except concurrent.futures.TimeoutError:
            if _stopped:
                future.cancel()
                raise _stopped_error(what) from None
        except concurrent.futures.CancelledError:
            raise _stopped_error(what) from None
        except Exception as exc:
            raise classify(exc, what) from None


class NativeHttp:
    """GETs of paths under one base URL (an origin, perhaps with a path prefix).

    Redirects are followed (the Hub sends its large files to a CDN) and ``headers`` — the
    token — are never sent to another host (reqwest drops them when a redirect changes host
    or port). The environment's HTTP(S)_PROXY and NO_PROXY are honoured, as on the urllib3 path.
    """

    def __init__(
        self,
        base_url: str,
        *,
        headers: Mapping[str, str],
        timeout: float,
        ca_bundle: str | None = None,
    ) -> None:
        self._base_url = base_url
        self._options = _client_options(base_url, dict(headers), timeout, ca_bundle)
        self._store: tuple[int, HTTPStore] | None = None
        self._lock = threading.Lock()

    def _store_here(self) -> HTTPStore:
        """The store (and its connection pool) of this process: a child never uses its
        parent's connections."""
        with self._lock:
            if self._store is None or self._store[0] != os.getpid():
                store = HTTPStore.from_url(
                    self._base_url,
                    client_options=self._options,  # type: ignore[arg-type]
                    retry_config={"max_retries": 0},  # the engine's RetryPolicy retries
                )
                self._store = (os.getpid(), store)
            return self._store[1]

    def open_range(self, path: str, start: int, end: int, what: str, whole: bool) -> RangeReader:
        """GET bytes ``[start, end)`` of ``path``; ``whole`` (the range is the entire file)
        sends a plain GET, as servers attach whole-file checksums only to those."""
        store, length = self._store_here(), end - start
        options: dict[str, Any] = {} if whole else {"range": (start, end)}

        async def read_all() -> Any:
            result = await obstore.get_async(store, path, options=options)  # type: ignore[arg-type]
            return await result.bytes_async()

        async def open_stream() -> Any:
            result = await obstore.get_async(store, path, options=options)  # type: ignore[arg-type]
            return result.stream(min_chunk_size=CHUNK_SIZE)

        if length <= WHOLE_BODY:
            return _Body(_call(read_all, what), length, what)
        return _Stream(_call(open_stream, what), length, what)

    def close(self) -> None:
        with self._lock:
            self._store = None  # its pool closes with it


class _Body(RangeReader):
    """A response read whole by the native client."""

    headers: Mapping[str, str] = {}

    def __init__(self, body: Any, length: int, what: str) -> None:
        _check_length(len(body), length, what)
        self._body = body

    def chunks(self) -> Iterator[memoryview]:
        if len(self._body):
            yield memoryview(self._body)

    def close(self) -> None:
        self._body = b""


class _Stream(RangeReader):
    """A response streamed in chunks of about 1 MiB, each fetched from the loop thread."""

    headers: Mapping[str, str] = {}

    def __init__(self, stream: Any, length: int, what: str) -> None:
        self._stream = stream
        self._length = length
        self._what = what

    def chunks(self) -> Iterator[memoryview]:
        received = 0

        async def next_chunk() -> Any:
            try:
                return await self._stream.__anext__()
            except StopAsyncIteration:
                return None

        while (chunk := _call(next_chunk, self._what)) is not None:
            received += len(chunk)
            if received > self._length:
                raise IntegrityError(f"{self._what}: the server sent more bytes than asked")
            yield memoryview(chunk)
        _check_length(received, self._length, self._what)

    def close(self) -> None:
        self._stream = None  # an unfinished body's connection is dropped with it


def _check_length(received: int, expected: int, what: str) -> None:
    if received < expected:
        raise TransientError(f"{what}: body ended after {received} of {expected} bytes")
    if received > expected:
        raise IntegrityError(f"{what}: the server sent more bytes than asked")


def _client_options(
    base_url: str, headers: dict[str, str], timeout: float, ca_bundle: str | None
) -> dict[str, Any]:
    parts = urlsplit(base_url)
    options: dict[str, Any] = {
        "allow_http": parts.scheme == "http",
        "connect_timeout": timedelta(seconds=min(CONNECT_TIMEOUT, timeout)),
        "read_timeout": timedelta(seconds=timeout),
        "timeout": REQUEST_LIMIT,
        "user_agent": headers.pop("User-Agent", "kf-initializers"),
        "default_headers": headers,
    }
    if ca_bundle:
        try:
            with open(ca_bundle, "rb") as bundle:
                options["root_certificate"] = bundle.read()
        except OSError as exc:
            raise UsageError(f"cannot read the CA bundle {ca_bundle}: {exc.strerror}") from None
    proxy = urllib.request.getproxies_environment().get(parts.scheme)
    if proxy and not urllib.request.proxy_bypass_environment(parts.hostname or ""):
        options["proxy_url"] = proxy
        no_proxy = os.environ.get("NO_PROXY") or os.environ.get("no_proxy")
        if no_proxy:
            options["proxy_excludes"] = no_proxy
    return options


_STATUS = re.compile(r"status code: (\d{3})")


def classify(exc: BaseException, what: str) -> InitializerError:
    """Map an obstore failure to a typed error, with a message free of URLs.

    obstore 0.12 names the HTTP status only in its message ("... status code: 503 ..."), so the
    status is read from there and judged by :mod:`initializers.httpstatus`, as on the urllib3 path.
    """
    if isinstance(exc, InitializerError):
        return exc
    if isinstance(exc, FileNotFoundError):  # obstore's NotFoundError
        return _status_error(404, what)
    if isinstance(exc, native_errors.UnauthenticatedError):
        return _status_error(401, what)
    if isinstance(exc, native_errors.PermissionDeniedError):
        return _status_error(403, what)
    if isinstance(exc, native_errors.PreconditionError):
        return _status_error(412, what)
    if isinstance(exc, native_errors.NotSupportedError):
        return IntegrityError(f"{what}: the server ignored the byte range it was asked for")
    text = str(exc)
    found = _STATUS.search(text)
    if found:
        return _status_error(int(found[1]), what)
    lowered = text.lower()
    if "certificate" in lowered or "tls" in lowered:
        return UsageError(
            f"{what}: TLS verification failed; pass --ca-bundle with the endpoint's CA, "
            "or use its http:// URL"
        )
    if "timeout" in lowered or "timed out" in lowered:
        return TransientError(f"{what}: the server stalled past the timeout")
    if "redirect" in lowered:
        return TransientError(f"{what}: too many redirects")
    if "error sending request" in lowered or "connect" in lowered:
        return TransientError(f"{what}: cannot connect to the server")
    return TransientError(f"{what}: connection failed ({type(exc).__name__})")


def _status_error(status: int, what: str) -> InitializerError:
    return status_error(status, what) or TransientError(f"{what}: HTTP {status} in a failure")

"""The native byte path for small bodies: GETs made in Rust by obstore (Arrow's ``object_store``).

Why: on a dataset of many small files the urllib3 path spends about 1.5 ms of interpreter time
per file building the request and parsing the response, under the GIL. Here the request, the
redirects, the connection pool and the body live in Rust; Python hands over a path and gets the
body back, and small files are requested ahead of the engine's workers, so a store 20 ms away
gets many requests at once without a thread each. In `make bench` runs on a busy machine (load
average ~6, 5 paired rounds) the Hub dataset went from 0.80x the naive "HfApi listing + obstore"
script (a84d4ee) to 1.04x (8987203, 32 read ahead per process), and with 20 ms of latency from
0.71x to 1.10x. 16 per process keeps the peak RSS of the two-process run at 126-145 MiB
(32: 201 MiB).

Only bodies up to :data:`WHOLE_BODY` come this way. Large ranges stay on the urllib3 path
(:mod:`initializers.transport`), which reads into one reused buffer: streamed through obstore
the 2 GiB benchmark model took 190-200 MiB of RSS at 16 ranges in flight (about 6 MiB held per
stream) against 73 MiB, and ran slower.

How: one asyncio loop thread per process drives obstore's async calls; a worker thread waits for
its body in short slices, so a stop (SIGTERM, through
:func:`initializers.interrupts.interrupt_reads`) ends every wait at once and refuses any request
that would start after. A stall ends at ``read_timeout`` (the gap between two reads). Failures are
classified here, once, into the typed errors of :mod:`initializers.errors`, by the status rules
of :mod:`initializers.httpstatus`; messages name the file, never the URL.
"""

from __future__ import annotations

import asyncio
import collections
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

WHOLE_BODY = 1 << 20  # the largest body read here: one call, and a cut loses no more than that
CONNECT_TIMEOUT = 10.0
WAIT_SLICE = 0.2  # seconds a waiting worker sleeps between looks at the stop flag
READ_AHEAD = 16  # small bodies requested ahead of the workers, per process (<= 16 MiB held)
REQUEST_LIMIT = timedelta(hours=1)  # stalls are caught by the read timeout, not by this

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

    return _wait(asyncio.run_coroutine_threadsafe(run(), _running_loop()), what)


def _wait(future: concurrent.futures.Future[T], what: str) -> T:
    """The result of ``future``, waited for in slices so that a stop ends the wait at once."""
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
        self._ahead: dict[tuple[str, int, int], concurrent.futures.Future[Any]] = {}
        self._budget: asyncio.Semaphore | None = None  # read-ahead bodies not yet taken
        self._tasks: set[asyncio.Future[None]] = set()

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

    def read_ahead(self, requests: list[tuple[str, int, int, bool]]) -> None:
        """Request these ``(path, start, end, whole)`` bodies now, in this order, ahead of the
        :meth:`open_range` calls that will take them: requests in flight are then not bounded
        by the engine's threads (a store 20 ms away needs many at once), while at most
        :data:`READ_AHEAD` bodies of up to 1 MiB wait to be taken. Larger ones are left out."""
        store = self._store_here()
        queued = []
        for path, start, end, whole in requests:
            if end - start <= WHOLE_BODY and not _stopped:
                future: concurrent.futures.Future[Any] = concurrent.futures.Future()
                self._ahead[(path, start, end)] = future
                queued.append((path, start, end, whole, future))
        if queued:
            asyncio.run_coroutine_threadsafe(self._run_ahead(store, queued), _running_loop())

    async def _run_ahead(self, store: HTTPStore, queued: list[tuple[Any, ...]]) -> None:
        if self._budget is None:
            self._budget = asyncio.Semaphore(READ_AHEAD)
        budget = self._budget
        # Taken off the queue one by one: a future kept here would keep its body alive after
        # the worker took it (every body of the run, measured: 1.2 GiB of RSS on 1 GiB).
        pending = collections.deque(queued)
        queued.clear()
        while pending:
            path, start, end, whole, future = pending.popleft()
            await budget.acquire()
            # A worker that got to it first has cancelled it and asked on its own.
            if _stopped or not future.set_running_or_notify_cancel():
                budget.release()
                continue
            task = asyncio.ensure_future(self._fill(store, path, start, end, whole, future))
            self._tasks.add(task)  # the loop keeps only a weak reference
            task.add_done_callback(self._tasks.discard)

    async def _fill(
        self,
        store: HTTPStore,
        path: str,
        start: int,
        end: int,
        whole: bool,
        future: concurrent.futures.Future[Any],
    ) -> None:
        try:
            future.set_result(await _read_all(store, path, start, end, whole))
        except Exception as exc:
            future.set_exception(exc)
            self._release()

    def _release(self) -> None:
        if self._budget is not None:
            self._budget.release()

    def open_range(self, path: str, start: int, end: int, what: str, whole: bool) -> RangeReader:
        """GET bytes ``[start, end)`` of ``path`` (at most :data:`WHOLE_BODY`); ``whole`` (the
        range is the entire file) sends a plain GET, as servers attach whole-file checksums
        only to those.

        A body requested ahead is taken from there (once: a retry asks again); one whose turn
        has not come yet is cancelled and asked for now."""
        if end - start > WHOLE_BODY:
            raise ValueError(f"{what}: {end - start} bytes is more than one native read")
        store = self._store_here()
        ahead = self._ahead.pop((path, start, end), None)
        if ahead is not None and not ahead.cancel():
            body = _wait(ahead, what)  # a failed one has given its place back already
            _running_loop().call_soon_threadsafe(self._release)
        else:
            body = _call(lambda: _read_all(store, path, start, end, whole), what)
        return _Body(body, end - start, what)

    def close(self) -> None:
        with self._lock:
            self._store = None  # its pool closes with it
            for future in self._ahead.values():
                future.cancel()
            self._ahead.clear()
            self._budget = None


async def _read_all(store: HTTPStore, path: str, start: int, end: int, whole: bool) -> Any:
    options: dict[str, Any] = {} if whole else {"range": (start, end)}
    result = await obstore.get_async(store, path, options=options)  # type: ignore[arg-type]
    return await result.bytes_async()


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
_KIND = re.compile(r"HttpError \{\s*kind: (\w+)")


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
    if "certificate" in lowered or "invalid peer" in lowered:
        return UsageError(
            f"{what}: TLS verification failed; pass --ca-bundle with the endpoint's CA, "
            "or use its http:// URL"
        )
    # The kind object_store gives the failure, from its debug text ("HttpError { kind: ...").
    kind = _KIND.search(text)
    reason = kind[1] if kind else type(exc).__name__
    if reason == "Connect":
        return TransientError(f"{what}: cannot connect to the server")
    if reason == "Timeout":
        return TransientError(f"{what}: the server stalled past the timeout")
    if "too many redirects" in lowered:
        return TransientError(f"{what}: too many redirects")
    return TransientError(f"{what}: connection failed ({reason})")


def _status_error(status: int, what: str) -> InitializerError:
    return status_error(status, what) or TransientError(f"{what}: HTTP {status} in a failure")

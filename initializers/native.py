"""The native byte path for small bodies: GETs made in Rust by pyreqwest (reqwest, hyper, tokio).

Why: on a dataset of many small files the urllib3 path spends about 0.8 ms of interpreter time
per file building the request and parsing the response, in a thread per request that hands the
GIL on at every system call. Here the request, the redirects, the connection pool and the body
live in Rust, driven by one asyncio loop thread per process (the engine's
:mod:`initializers.wholefiles` keeps many requests in flight there without a thread each);
Python gets the status, the headers and the body back. The headers are what obstore, used here
before, did not give: S3's ``x-amz-checksum-*`` now verify small objects on this path too.

Only bodies up to :data:`WHOLE_BODY` come this way. Large ranges stay on the urllib3 path
(:mod:`initializers.transport`), which reads into one reused buffer instead of holding a whole
range in memory. :meth:`NativeHttp.open_range` serves worker threads (a retry, a checksum
mismatch's second fetch) over the same client.

A worker thread waits for its body in short slices, and the loop's work ends at once on a stop
(SIGTERM, through :func:`initializers.interrupts.interrupt_reads`), which also refuses any
request that would start after. A server that never answers is caught after ``timeout``
seconds, a stalled body after the same gap between two reads. The client's runtime must never
cross a fork: it is built on first use in each process, and once built, this process forks no
workers (:func:`initializers.processes.forbid_fork`). The status is judged by
:mod:`initializers.httpstatus`, as on the urllib3 path; messages name the file, never the URL.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import threading
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from datetime import timedelta
from typing import TypeVar
from urllib.parse import urlsplit

# Loaded by the main thread, with the source module: loaded instead on a thread that had ended
# before the fork of the worker processes (tried, to overlap imports with the listing), it made
# every forked child die of SIGSEGV.
from pyreqwest import exceptions as native_errors
from pyreqwest.client import Client, ClientBuilder
from pyreqwest.proxy import ProxyBuilder
from pyreqwest.response import Response
from urllib3 import HTTPHeaderDict

from initializers import processes
from initializers.errors import (
    InitializerError,
    IntegrityError,
    TlsRefused,
    TransientError,
    UsageError,
    tls_refused,
    unloadable_ca_bundle,
)
from initializers.httpstatus import check_answer, range_value
from initializers.interrupts import on_interrupt
from initializers.streams import RangeReader

WHOLE_BODY = 1 << 20  # the largest body read here: one call, and a cut loses no more than that
CONNECT_TIMEOUT = 10.0
WAIT_SLICE = 0.2  # seconds a waiting worker sleeps between looks at the stop flag
REQUEST_LIMIT = timedelta(hours=1)  # stalls are caught by the read timeout, not by this
MAX_REDIRECTS = 10

T = TypeVar("T")

log = logging.getLogger(__name__)


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


class NativeRefused(Exception):
    """The native client refuses this endpoint's certificate where ``--ca-bundle`` may make
    OpenSSL (the urllib3 path's TLS) accept it: the file is to go that way. Neither transient
    nor final, so the engine hands the file to the workers with no attempt counted."""


class NativeHttp:
    """GETs of paths under one base URL (an origin, perhaps with a path prefix).

    ``headers`` go with every request; a request may add its own, made as it is sent (an S3
    signature, which must be fresh). Redirects are followed (the Hub sends its large files to a
    CDN), and Authorization and Cookie are never sent to another host (reqwest drops them when
    a redirect changes host or port). The environment's HTTP(S)_PROXY and NO_PROXY are
    honoured, as on the urllib3 path. Paths come percent-encoded.
    """

    def __init__(
        self,
        base_url: str,
        *,
        headers: Mapping[str, str],
        timeout: float,
        roots: Sequence[bytes] = (),
    ) -> None:
        self._base_url = base_url.rstrip("/")
        self._headers = {"Accept-Encoding": "identity", **headers}
        self._timeout = timeout
        self._roots = roots  # the CA bundle's certificates (read_roots); none: the system's
        self._client: tuple[int, Client] | None = None
        self._lock = threading.Lock()
        # Set when rustls refused a certificate the CA bundle vouches for: it takes no CA
        # certificate as a server's ("CaUsedAsEndEntity"), as `openssl req -x509` makes them for
        # a MinIO, where OpenSSL accepts one. The rest of the run goes the urllib3 way.
        self.refused = False

    def _client_here(self) -> Client:
        """The client (its runtime and connection pool) of this process: a child never uses
        its parent's, and a process that has one forks no workers after."""
        with self._lock:
            if self._client is None or self._client[0] != os.getpid():
                processes.forbid_fork()  # its runtime's threads would not survive one
                self._client = (os.getpid(), self._build())
            return self._client[1]

    def _build(self) -> Client:
        headers = dict(self._headers)
        builder = (
            ClientBuilder()
            .connect_timeout(timedelta(seconds=min(CONNECT_TIMEOUT, self._timeout)))
            .read_timeout(timedelta(seconds=self._timeout))
            .timeout(REQUEST_LIMIT)
            .user_agent(headers.pop("User-Agent", "kf-initializers"))
            .default_headers(headers)
            .max_redirects(MAX_REDIRECTS)
            .gzip(False)  # the bytes as stored: a checksum covers those
            .brotli(False)
            .deflate(False)
            .zstd(False)
            .no_proxy()  # then exactly the urllib3 path's proxy, below
        )
        proxy = _proxy_for(self._base_url)
        if proxy is not None:
            builder = builder.proxy(proxy)
        for root in self._roots:
            builder = builder.add_root_certificate_pem(root)
        return builder.build()

    def _url(self, path: str) -> str:
        return f"{self._base_url}/{path.lstrip('/')}"

    @contextlib.asynccontextmanager
    async def get_whole(
        self, path: str, size: int, what: str, headers: Mapping[str, str] | None = None
    ) -> AsyncIterator[Streamed]:
        """GET the whole ``size``-byte file at ``path``, on this process's loop thread (see
        :func:`run_on_loop`): its response, status checked, its body to be read inside."""
        if _stopped:
            raise _stopped_error(what)
        if self.refused:
            raise NativeRefused(what)
        client, url = self._client_here(), self._url(path)
        try:
            async with _exchange(client, url, 0, size, True, headers, what, self._timeout) as body:
                yield body
        except TlsRefused as exc:
            raise self._refusal(exc, what) from None

    def _refusal(self, exc: TlsRefused, what: str) -> Exception:
        """What a TLS refusal means: where a CA bundle was given, OpenSSL may accept the
        certificate, and the native path is done with for the run; otherwise, the refusal."""
        if not self._roots:
            return exc
        if not self.refused:
            self.refused = True
            log.warning(
                "the native HTTP client refused the endpoint's TLS certificate, which the CA "
                "bundle may vouch for (it takes no CA certificate as a server's); small files "
                "go over OpenSSL for the rest of this run"
            )
        return NativeRefused(what)

    def open_range(
        self,
        path: str,
        start: int,
        end: int,
        what: str,
        whole: bool,
    ) -> RangeReader:
        """GET bytes ``[start, end)`` of ``path`` (at most :data:`WHOLE_BODY`) from a worker
        thread, waiting in slices a stop ends; ``whole`` (the range is the entire file) sends a
        plain GET, as servers attach whole-file checksums only to those."""
        if end - start > WHOLE_BODY:
            raise ValueError(f"{what}: {end - start} bytes is more than one native read")
        if self.refused:
            raise NativeRefused(what)
        client = self._client_here()
        url = self._url(path)
        exchange = _exchange(client, url, start, end, whole, None, what, self._timeout)
        try:
            return _call(lambda: _read_all(exchange), what)
        except TlsRefused as exc:
            raise self._refusal(exc, what) from None

    def close(self) -> None:
        with self._lock:
            self._client = None  # its pool closes with it


@contextlib.asynccontextmanager
async def _exchange(
    client: Client,
    url: str,
    start: int,
    end: int,
    whole: bool,
    headers: Mapping[str, str] | None,
    what: str,
    timeout: float,
) -> AsyncIterator[Streamed]:
    """Send the GET of ``[start, end)``, check its status (and its range, for a range), and
    give its body to be read as it arrives; the response is closed on the way out."""
    own = dict(headers) if headers is not None else {}
    if not whole:
        own["Range"] = range_value(start, end)
    # Streamed: the client holds at most its read buffer of the body (64 KiB by default), not
    # the whole of it, as a request built to be consumed would before answering.
    request = client.get(url).headers(own).build_streamed()
    try:
        # The client's read timeout starts with the body: a server that never answers is
        # caught here, after the same gap. A deadline on this task, not wait_for's task per
        # request (~7% of the loop thread's Python time on the S3 dataset, by py-spy).
        async with asyncio.timeout(timeout):
            response = await request.__aenter__()
    except TimeoutError:
        raise TransientError(f"{what}: the server stalled past the timeout") from None
    except Exception as exc:
        raise classify(exc, what) from None
    try:
        check_answer(response.status, response.headers, start, end, whole, what)
        yield Streamed(response, end - start, what)
    finally:
        await request.__aexit__(None, None, None)


async def _read_all(exchange: AbstractAsyncContextManager[Streamed]) -> _Body:
    """A range read whole (a worker's retry: at most :data:`WHOLE_BODY`)."""
    async with exchange as body:
        data = bytearray()
        async for chunk in body.chunks():
            data += chunk
        return _Body(body.headers, data)


class Streamed:
    """A response on the loop: its headers now, its body as it arrives.

    Read in the pieces the connection delivers, each written out while it is still in the
    CPU's cache: a body read whole first was copied from memory again (the S3 dataset, one
    process, 12 in flight: 2.4-2.9 s of CPU against 1.9-2.3 s), and held whole until written.
    """

    def __init__(self, response: Response, size: int, what: str) -> None:
        # Copied out of the client's map, which keeps its whole response alive (each file
        # keeps its headers until committed).
        self.headers: Mapping[str, str] = HTTPHeaderDict(response.headers.items())
        self._reader = response.body_reader
        self._size = size
        self._what = what
        # Framed at the size asked: the client ends the body there itself, so the read that
        # would only say so is not made (each read is a wake-up of this thread by the client's).
        self._framed = self.headers.get("Content-Length") == str(size)

    async def chunks(self) -> AsyncIterator[memoryview]:
        """The body's pieces, exactly ``size`` bytes in all: a shorter body is a transient
        failure, a longer one an integrity failure, met at the first piece too many (never
        buffered: a server sending gigabytes where it listed a small file)."""
        received = 0
        while not (self._framed and received == self._size):
            try:
                chunk = await self._reader.read_chunk()
            except Exception as exc:
                raise classify(exc, self._what) from None
            if chunk is None:
                break
            received += len(chunk)
            if received > self._size:
                _check_length(received, self._size, self._what)
            yield memoryview(chunk)
        _check_length(received, self._size, self._what)


class _Body(RangeReader):
    """A range read whole by the native client, with its headers (a worker thread's)."""

    def __init__(self, headers: Mapping[str, str], body: bytearray) -> None:
        self.headers = headers
        self._body = body

    def chunks(self) -> Iterator[memoryview]:
        if len(self._body):
            yield memoryview(self._body)

    def close(self) -> None:
        self._body = bytearray()


def _check_length(received: int, expected: int, what: str) -> None:
    if received < expected:
        raise TransientError(f"{what}: body ended after {received} of {expected} bytes")
    if received > expected:
        raise IntegrityError(f"{what}: the server sent more bytes than asked")


def read_roots(ca_bundle: str | None) -> list[bytes]:
    """The PEM certificates of ``ca_bundle`` (``--ca-bundle``), one by one, as the native client
    takes them; read once a run, for every client that needs them. None given: an empty list."""
    if not ca_bundle:
        return []
    try:
        with open(ca_bundle, "rb") as bundle:
            text = bundle.read()
    except OSError as exc:
        raise UsageError(f"cannot read the CA bundle {ca_bundle}: {exc.strerror}") from None
    end = b"-----END CERTIFICATE-----"
    parts = [part.strip() for part in text.split(end) if b"-----BEGIN" in part]
    roots = [part + b"\n" + end + b"\n" for part in parts]
    if not roots:
        raise UsageError(unloadable_ca_bundle(ca_bundle))
    return roots


def _proxy_for(base_url: str) -> ProxyBuilder | None:
    """The environment's proxy for ``base_url``'s scheme, as the urllib3 path chooses it."""
    parts = urlsplit(base_url)
    proxy = urllib.request.getproxies_environment().get(parts.scheme)
    if not proxy or urllib.request.proxy_bypass_environment(parts.hostname or ""):
        return None
    builder = ProxyBuilder.https(proxy) if parts.scheme == "https" else ProxyBuilder.http(proxy)
    no_proxy = urllib.request.getproxies_environment().get("no")
    return builder.no_proxy(no_proxy) if no_proxy else builder


def classify(exc: BaseException, what: str) -> InitializerError | TransientError:
    """Map a failure of the native client to a typed error, with a message free of URLs."""
    if isinstance(exc, InitializerError | TransientError):
        return exc
    text = str(exc).lower()
    if isinstance(exc, native_errors.ConnectError | native_errors.ConnectTimeoutError):
        if "certificate" in text or "invalid peer" in text or "tls" in text:
            return TlsRefused(tls_refused(what))
        return TransientError(f"{what}: cannot connect to the server")
    if isinstance(exc, native_errors.RequestTimeoutError):
        return TransientError(f"{what}: the server stalled past the timeout")
    if isinstance(exc, native_errors.RedirectError):
        return TransientError(f"{what}: too many redirects")
    return TransientError(f"{what}: connection failed ({type(exc).__name__})")


def run_on_loop(make: Callable[[], Awaitable[None]], stop: threading.Event) -> None:
    """Run ``make()`` on this process's loop thread until it ends, or until a stop (``stop``,
    or SIGTERM) cancels it; either way return only once it has ended, so nothing it started
    still writes when the caller moves on."""
    ended = threading.Event()

    async def run() -> None:
        try:
            await make()
        finally:
            ended.set()

    future = asyncio.run_coroutine_threadsafe(run(), _running_loop())
    while not ended.wait(WAIT_SLICE):
        if _stopped or stop.is_set():
            future.cancel()
            ended.wait()
            return
    future.result()  # its failure, if it failed

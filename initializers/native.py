"""The native byte path: GETs made in Rust by pyreqwest (reqwest, hyper, tokio, rustls).

Why: on a dataset of many small files the urllib3 path spends about 0.8 ms of interpreter time
per file building the request and parsing the response, in a thread per request that hands the
GIL on at every system call; over HTTPS, each 16 KiB TLS record of a large range is one more
hand-off (the S3 model over HTTPS ran at 0.59x s5cmd that way). Here the request, the
redirects, the connection pool, TLS and the body live in Rust; Python gets the status, the
headers and the body in the pieces the connection delivers. The headers are what obstore, used
here before, did not give: S3's ``x-amz-checksum-*`` verify every object on this path too.

Two clients. Small files from S3 and the Hub are fetched whole on one asyncio loop thread per
process (:meth:`NativeHttp.get_whole`, driven by :mod:`initializers.wholefiles`, many requests
in flight without a thread each). Ranges of any size, from S3, the Hub, GCS and Azure, are read
by the worker threads through the blocking client (:meth:`NativeHttp.open_range`): a worker
waits in Rust with the GIL released while the multithreaded runtime's threads read and decrypt,
and is handed the body in the pieces the connection delivers (some 350 KiB each over a fast
link, against urllib3's 16 KiB TLS records, each of which was a hand-off of the GIL). urllib3
(:mod:`initializers.transport`) remains the way when rustls refuses a certificate the CA bundle
vouches for.

A stop (SIGTERM, through :func:`initializers.interrupts.interrupt_reads`) ends the loop's work at
once and refuses any request that would start after it; a worker blocked in a blocking read is
released by shutting down this process's client connections (:mod:`initializers.hangup`). A
server that never answers is caught after ``timeout`` seconds, a stalled body after the same gap
between two reads. A runtime must never cross a fork: the clients are built on first use in
each process, and once built, this process forks no workers
(:func:`initializers.processes.forbid_fork`). The status is judged by
:mod:`initializers.httpstatus`, as on the urllib3 path; messages name the file, never the URL.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

# Loaded by the main thread, with the source module: loaded instead on a thread that had ended
# before the fork of the worker processes (tried, to overlap imports with the listing), it made
# every forked child die of SIGSEGV.
from pyreqwest import exceptions as native_errors
from pyreqwest.client import Client, ClientBuilder, SyncClient, SyncClientBuilder
from pyreqwest.http import HeaderMap
from pyreqwest.proxy import ProxyBuilder
from pyreqwest.request import SyncStreamRequest
from pyreqwest.response import Response, SyncResponse

from initializers import hangup, processes
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
from initializers.transport import HttpTransport

CONNECT_TIMEOUT = 10.0
WAIT_SLICE = 0.2  # seconds between two cuts of the connections after a stop
REQUEST_LIMIT = timedelta(hours=1)  # stalls are caught by the read timeout, not by this
MAX_REDIRECTS = 10

log = logging.getLogger(__name__)


# Set once by the first interrupt, never cleared: a stop is final (a plain flag, as the signal
# handler that sets it must take no lock).
_stopped = False
_loop_lock = threading.Lock()
_loop: tuple[int, asyncio.AbstractEventLoop] | None = None  # (pid, loop): a fork starts anew
# Blocking reads in flight on worker threads: while there are any, a stop cuts the connections.
_blocking_reads = 0
_blocking_lock = threading.Lock()


@on_interrupt
def cancel_requests() -> None:
    """Cancel every native request in flight and refuse new ones (called on SIGTERM): the
    loop's by their flag, the workers' blocking reads by cutting their connections."""
    global _stopped
    _stopped = True
    if _blocking_reads:
        hangup.cut_while(lambda: _blocking_reads > 0, WAIT_SLICE)


def _count_blocking_read(change: int) -> None:
    global _blocking_reads
    with _blocking_lock:
        _blocking_reads += change


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
        self._clients: dict[bool, tuple[int, Client | SyncClient]] = {}  # blocking? -> (pid, it)
        self._lock = threading.Lock()
        # Set when rustls refused a certificate the CA bundle vouches for: it takes no CA
        # certificate as a server's ("CaUsedAsEndEntity"), as `openssl req -x509` makes them for
        # a MinIO, where OpenSSL accepts one. The rest of the run goes the urllib3 way.
        self.refused = False

    def _client_here(self, blocking: bool) -> Client | SyncClient:
        """This process's client of that kind (its connection pool, on the shared runtime): a
        child never uses its parent's, and a process that has one forks no workers after."""
        with self._lock:
            built = self._clients.get(blocking)
            if built is None or built[0] != os.getpid():
                processes.forbid_fork()  # the runtime's threads would not survive one
                builder = (
                    SyncClientBuilder().http1_only().runtime_multithreaded(True)
                    if blocking
                    else ClientBuilder()
                )
                built = self._clients[blocking] = (os.getpid(), self._build(builder))
            return built[1]

    def _build(self, builder: ClientBuilder | SyncClientBuilder) -> Client | SyncClient:
        """``builder`` set up as every native client is. The blocking one speaks HTTP/1.1
        only: a connection per range, as the urllib3 path and s5cmd have, rather than every
        range of a host multiplexed on one HTTP/2 connection with one congestion window. Its
        connections are driven on the multithreaded runtime (a thread per CPU), so the
        decryption of many ranges is spread over the CPUs: on this machine's 2 CPUs the S3 model
        over HTTPS took 1.74-1.79 s that way, 2.03-2.09 s on the single loop thread."""
        headers = dict(self._headers)
        builder = (
            builder.connect_timeout(timedelta(seconds=min(CONNECT_TIMEOUT, self._timeout)))
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
        client, url = self._client_here(blocking=False), self._url(path)
        assert isinstance(client, Client)
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
                "bundle may vouch for (it takes no CA certificate as a server's); files go "
                "over OpenSSL for the rest of this run"
            )
        return NativeRefused(what)

    def open_range(
        self,
        path: str,
        start: int,
        end: int,
        what: str,
        whole: bool,
        headers: Mapping[str, str] | None = None,
    ) -> RangeReader:
        """GET bytes ``[start, end)`` of ``path`` from a worker thread, through the blocking
        client: its reads wait in Rust with the GIL released, and a stop cuts them short.
        ``whole`` (the range is the entire file) sends a plain GET, as servers attach
        whole-file checksums only to those."""
        if self.refused:
            raise NativeRefused(what)
        client = self._client_here(blocking=True)
        assert isinstance(client, SyncClient)
        _count_blocking_read(+1)  # before the look at the flag: a stop sees one or the other
        try:
            if _stopped:
                raise _stopped_error(what)
            own = _range_headers(headers, start, end, whole)
            # Each piece is handed over as it arrives: a stop keeps every byte that came.
            request = (
                client.get(self._url(path)).headers(own).streamed_read_buffer_limit(1)
            ).build_streamed()
            return _BlockingRange(request, start, end, whole, what)
        except TlsRefused as exc:
            _count_blocking_read(-1)
            raise self._refusal(exc, what) from None
        except BaseException:
            _count_blocking_read(-1)
            raise

    def open_range_or_urllib3(
        self,
        transport: HttpTransport,
        path: str,
        headers: Mapping[str, str],
        start: int,
        end: int,
        what: str,
        whole: bool,
    ) -> RangeReader:
        """:meth:`open_range`, or the same GET through ``transport`` (urllib3 and OpenSSL) once
        rustls refused a certificate the CA bundle vouches for."""
        with contextlib.suppress(NativeRefused):
            return self.open_range(path, start, end, what, whole, headers)
        url = self._url(path)
        return transport.open_range(url, {**self._headers, **headers}, start, end, what, whole)

    def close(self) -> None:
        with self._lock:
            self._clients.clear()  # their pools close with them


def _range_headers(
    headers: Mapping[str, str] | None, start: int, end: int, whole: bool
) -> dict[str, str]:
    own = dict(headers) if headers is not None else {}
    if not whole:
        own["Range"] = range_value(start, end)
    return own


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
    # Streamed: the client holds at most its read buffer of the body (64 KiB by default), not
    # the whole of it, as a request built to be consumed would before answering.
    request = client.get(url).headers(_range_headers(headers, start, end, whole)).build_streamed()
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


class _BodyCount:
    """A body's bytes counted against the ``size`` asked for: a shorter body is a transient
    failure, a longer one an integrity failure, met at the first piece too many (never
    buffered: a server sending gigabytes where it listed a small file)."""

    def __init__(self, headers: Mapping[str, str], size: int, what: str) -> None:
        self.received = 0
        self._size = size
        self._what = what
        # Framed at the size asked: the client ends the body there itself, so the read that
        # would only say so is not made (each read is a wake-up of this thread by the client's).
        self._framed = headers.get("Content-Length") == str(size)

    def complete(self) -> bool:
        return self._framed and self.received == self._size

    def add(self, chunk: bytes) -> memoryview:
        self.received += len(chunk)
        if self.received > self._size:
            _check_length(self.received, self._size, self._what)
        return memoryview(chunk)

    def finish(self) -> None:
        _check_length(self.received, self._size, self._what)


class Streamed:
    """A response on the loop: its headers now, its body as it arrives.

    Read in the pieces the connection delivers, each written out while it is still in the
    CPU's cache: a body read whole first was copied from memory again (the S3 dataset, one
    process, 12 in flight: 2.4-2.9 s of CPU against 1.9-2.3 s), and held whole until written.
    """

    def __init__(self, response: Response, size: int, what: str) -> None:
        # Copied out of the client's map, which keeps its whole response alive (each file
        # keeps its headers until committed).
        self.headers: Mapping[str, str] = ResponseHeaders.of(response.headers)
        self._reader = response.body_reader
        self._count = _BodyCount(self.headers, size, what)
        self._what = what

    async def chunks(self) -> AsyncIterator[memoryview]:
        """The body's pieces, exactly ``size`` bytes in all."""
        while not self._count.complete():
            try:
                chunk = await self._reader.read_chunk()
            except Exception as exc:
                raise classify(exc, self._what) from None
            if chunk is None:
                break
            yield self._count.add(chunk)
        self._count.finish()


class _BlockingRange(RangeReader):
    """A range on a worker thread: sent at once, its body read in the pieces the connection
    delivers, each in memory of its own, written out and let go before the next. The response
    is closed, and the blocking read counted out, by :meth:`close`."""

    def __init__(
        self, request: SyncStreamRequest, start: int, end: int, whole: bool, what: str
    ) -> None:
        self._request = request
        self._what = what
        self._open = False
        response = self._send()
        try:
            check_answer(response.status, response.headers, start, end, whole, what)
        except BaseException:
            self._release()
            raise
        self.headers: Mapping[str, str] = ResponseHeaders.of(response.headers)
        self._reader = response.body_reader
        self._count = _BodyCount(self.headers, end - start, what)

    def _send(self) -> SyncResponse:
        try:
            response = self._request.__enter__()
        except Exception as exc:
            raise self._failure(exc) from None
        self._open = True
        return response

    def chunks(self) -> Iterator[memoryview]:
        while not self._count.complete():
            try:
                chunk = self._reader.read_chunk()
            except Exception as exc:
                raise self._failure(exc) from None
            if chunk is None:
                break
            yield self._count.add(chunk)
        self._count.finish()

    def _failure(self, exc: Exception) -> InitializerError | TransientError:
        """What a failed send or read means: after a stop, the stop (it cut the connection)."""
        return _stopped_error(self._what) if _stopped else classify(exc, self._what)

    def _release(self) -> None:
        if self._open:
            self._open = False
            with contextlib.suppress(Exception):
                self._request.__exit__(None, None, None)

    def close(self) -> None:
        self._release()
        _count_blocking_read(-1)


class ResponseHeaders(dict[str, str]):
    """A response's headers, looked up by name in any case, repeated names joined with ", "
    (as urllib3's ``HTTPHeaderDict`` does). Copied out of the client's map in one call
    (:meth:`of`): its live ``items()`` view crosses into the client for each header, ~35 µs a
    response on the S3 dataset's loop thread; ``HTTPHeaderDict`` built from the copy, ~17;
    this, ~9-12."""

    __slots__ = ()

    @classmethod
    def of(cls, headers: HeaderMap) -> ResponseHeaders:
        copy = cls(headers.dict_multi_value())  # the client gives names in lower case
        for name, value in copy.items():
            if not isinstance(value, str):
                copy[name] = ", ".join(value)
        return copy

    def get(self, name: str, default: Any = None) -> Any:  # type: ignore[override]
        return super().get(name.lower(), default)

    def __getitem__(self, name: str) -> str:
        return super().__getitem__(name.lower())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and super().__contains__(name.lower())


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
        if isinstance(exc, native_errors.ConnectTimeoutError) and not _while_connecting(exc):
            # The blocking client's read timeout also covers the wait for the headers, and
            # says "connection timeout" for it: only its causes tell a server that never answered.
            return TransientError(f"{what}: the server stalled past the timeout")
        return TransientError(f"{what}: cannot connect to the server{_os_reason(exc)}")
    if isinstance(exc, native_errors.RequestTimeoutError):
        return TransientError(f"{what}: the server stalled past the timeout")
    if isinstance(exc, native_errors.RedirectError):
        return TransientError(f"{what}: too many redirects")
    return TransientError(f"{what}: connection failed ({type(exc).__name__})")


def _causes(exc: native_errors.DetailedPyreqwestError) -> list[str]:
    """The messages of the failure's chain of causes, outermost first."""
    return [str(cause.get("message", "")) for cause in exc.details.get("causes") or []]


def _while_connecting(exc: native_errors.ConnectTimeoutError) -> bool:
    """Whether the timeout struck before the connection was made (a cause says "connect")."""
    return any("connect" in cause.lower() for cause in _causes(exc))


def _os_reason(exc: native_errors.DetailedPyreqwestError) -> str:
    """The system's reason among the causes, as the urllib3 path gives it: " (Connection
    refused)" for "Connection refused (os error 111)"; none found, nothing."""
    for cause in _causes(exc):
        reason, marker, _ = cause.partition(" (os error ")
        if marker:
            return f" ({reason})"
    return ""


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

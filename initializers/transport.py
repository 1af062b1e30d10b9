"""HTTP byte-range transport shared by every HTTP-speaking source (S3, Hub, ...).

urllib3 streams the body in 1 MiB reads (measured at loopback speed with a thread per request);
redirects are followed and credentials dropped when a redirect leaves the host (urllib3's
default). Failures are classified here, once, into the typed errors of
:mod:`initializers.errors`. Messages name the file, never the URL: a presigned URL carries a
signature and possibly a session token.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import ssl
import threading
import urllib.request
import weakref
from collections.abc import Collection, Iterator, Mapping
from typing import Protocol
from urllib.parse import urlsplit

import urllib3
from urllib3.exceptions import (
    HTTPError,
    MaxRetryError,
    NewConnectionError,
    ProtocolError,
    ProxyError,
    SSLError,
)
from urllib3.exceptions import TimeoutError as Urllib3Timeout

from initializers.errors import (
    InitializerError,
    IntegrityError,
    TlsRefused,
    TransientError,
    tls_refused,
)
from initializers.httpstatus import check_answer, range_value
from initializers.interrupts import on_interrupt
from initializers.streams import RangeReader

log = logging.getLogger(__name__)

CHUNK_SIZE = 1 << 20
CONNECT_TIMEOUT = 10.0


# Every socket the transports of this process opened and that is still open, so a stop can
# cut them all. A response whose connection http.client has already "closed" (it hands the socket
# over on Connection: close) still reads from it, so sockets are kept until really closed.
_SOCKETS: dict[int, socket.socket] = {}
_SOCKETS_LOCK = threading.Lock()
# Set by the first interrupt_reads(), never cleared: a stop is final, so a connection opened
# after it (by a worker that checked the stop flag just before the signal came) is cut as soon
# as it connects. A plain flag: the signal handler that sets it must take no lock.
_interrupted = False


def _remember(sock: socket.socket) -> None:
    with _SOCKETS_LOCK:
        for key, old in list(_SOCKETS.items()):
            if old.fileno() == -1:  # closed for good
                del _SOCKETS[key]
        _SOCKETS[id(sock)] = sock
    # After registering: either interrupt_reads() sees this socket or this sees its flag.
    if _interrupted:
        _cut(sock)


def _cut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


class _RemembersItsSocket:
    """Mixed into urllib3's connection classes: each socket they connect is remembered."""

    sock: socket.socket

    def connect(self) -> None:
        super().connect()  # type: ignore[misc]
        _remember(self.sock)


class _TrackedHTTPConnection(_RemembersItsSocket, urllib3.connection.HTTPConnection):
    pass


class _TrackedHTTPSConnection(_RemembersItsSocket, urllib3.connection.HTTPSConnection):
    pass


class _HTTPPool(urllib3.HTTPConnectionPool):
    ConnectionCls = _TrackedHTTPConnection


class _HTTPSPool(urllib3.HTTPSConnectionPool):
    ConnectionCls = _TrackedHTTPSConnection


_POOLS = {"http": _HTTPPool, "https": _HTTPSPool}


@on_interrupt
def interrupt_reads() -> None:
    """Shut down every open connection, so a read blocked on a stalled server returns at once.

    Called from the SIGTERM handler after the engine's stop flag is set: without it a worker
    stuck in a stalled read would only notice the stop when the read timed out (60 s by
    default, longer than a pod's grace period). It takes no lock (copying the dict is one C
    call under the GIL), and shuts the socket itself down, under any TLS layer. Connections
    opened afterwards are cut as they connect.
    """
    global _interrupted
    _interrupted = True
    for sock in list(_SOCKETS.values()):
        _cut(sock)


class PoolSettings(Protocol):
    """What sizes a transport: the connections the engine keeps in flight, and the options."""

    connections: int
    timeout: float
    ca_bundle: str | None


class HttpTransport:
    """A pool of keep-alive connections (through the environment's proxy when one is set)."""

    def __init__(self, *, connections: int, timeout: float, ca_bundle: str | None = None) -> None:
        self._timeout = urllib3.Timeout(connect=min(CONNECT_TIMEOUT, timeout), read=timeout)
        pool_args = {
            "maxsize": connections,  # kept alive per origin; more are opened, then discarded
            "block": False,
            "ca_certs": ca_bundle,
            "retries": False,
        }
        self._pool_args = pool_args
        self._fresh_pools()
        self._proxies = urllib.request.getproxies_environment()
        # A forked worker must not read from its parent's kept-alive sockets: both would.
        alive = weakref.WeakMethod(self._fresh_pools)
        os.register_at_fork(after_in_child=lambda: (fresh := alive()) and fresh())
        # Followed by hand so the per-hop rules below hold; credentials never cross hosts.
        self._retry = urllib3.Retry(
            total=None,
            connect=0,
            read=0,
            status=0,
            other=0,
            redirect=10,
            raise_on_redirect=True,
            raise_on_status=False,
        )

    def _fresh_pools(self) -> None:
        """Pools with no connection yet (those inherited over a fork are left unused)."""
        self._direct = _tracked(urllib3.PoolManager(**self._pool_args))
        self._proxied: dict[str, urllib3.ProxyManager] = {}

    @classmethod
    def for_settings(cls, settings: PoolSettings) -> HttpTransport:
        """A transport that keeps a connection for every request the engine may have in flight
        (:func:`initializers.inflight.connections_for`)."""
        return cls(
            connections=settings.connections,
            timeout=settings.timeout,
            ca_bundle=settings.ca_bundle,
        )

    def _manager_for(self, url: str) -> urllib3.PoolManager:
        parts = urlsplit(url)
        proxy = self._proxies.get(parts.scheme)
        if not proxy or urllib.request.proxy_bypass_environment(parts.hostname or ""):
            return self._direct
        if proxy not in self._proxied:
            self._proxied[proxy] = _tracked(urllib3.ProxyManager(proxy, **self._pool_args))
        return self._proxied[proxy]

    def open_range(
        self,
        url: str,
        headers: Mapping[str, str],
        start: int,
        end: int,
        what: str,
        whole: bool = False,
        private: Collection[str] = (),
    ) -> HttpRangeReader:
        """GET bytes ``[start, end)`` of ``url``; ``what`` names the file in any error.

        ``whole`` (the range is the entire file) sends a plain GET: servers attach full-object
        checksums only to those. Headers named in ``private`` are dropped, as Authorization
        and Cookie always are, when a redirect leads to another host.
        """
        request_headers = dict(headers)
        if not whole:
            request_headers["Range"] = range_value(start, end)
        request_headers.setdefault("Accept-Encoding", "identity")
        try:
            response = self._manager_for(url).request(
                "GET",
                url,
                headers=request_headers,
                preload_content=False,
                timeout=self._timeout,
                retries=self._retry_keeping_private(private),
                redirect=True,
            )
        except Exception as exc:
            raise classify_exception(exc, what) from None
        try:
            check_answer(response.status, response.headers, start, end, whole, what)
        except BaseException:
            _discard(response)
            raise
        return HttpRangeReader(response, end - start, what)

    def request(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        what: str,
        body: bytes | None = None,
        timeout: float | None = None,
    ) -> tuple[int, Mapping[str, str], bytes]:
        """One small request read whole (listings, token exchanges): status, headers, body.

        Transport failures raise typed errors; the status is the caller's to interpret.
        ``timeout`` shortens both timeouts for this request (a metadata server probe).
        """
        limits = self._timeout
        if timeout is not None:
            limits = urllib3.Timeout(connect=min(timeout, CONNECT_TIMEOUT), read=timeout)
        try:
            response = self._manager_for(url).request(
                method,
                url,
                headers=headers,
                body=body,
                timeout=limits,
                retries=self._retry,
                redirect=True,
            )
        except Exception as exc:
            raise classify_exception(exc, what) from None
        return response.status, response.headers, response.data

    def _retry_keeping_private(self, private: Collection[str]) -> urllib3.Retry:
        if not private:
            return self._retry
        dropped = {*self._retry.remove_headers_on_redirect, *(name.lower() for name in private)}
        return self._retry.new(remove_headers_on_redirect=dropped)

    def close(self) -> None:
        self._direct.clear()
        for manager in self._proxied.values():
            manager.clear()


def _tracked(manager: urllib3.PoolManager) -> urllib3.PoolManager:
    """``manager``, opening connections :func:`interrupt_reads` can reach."""
    manager.pool_classes_by_scheme = _POOLS
    return manager


class HttpRangeReader(RangeReader):
    """Streams one ranged response, turning transport failures into typed errors.

    The body is read straight into one reused 1 MiB buffer per thread through the standard
    library response urllib3 wraps (``readinto``): urllib3's own ``stream()`` allocates two
    fresh buffers per read, which measured 2-3x the CPU and 5-10x the page faults on a
    dataset of small files here. Each chunk is therefore only valid until the next one.
    """

    _buffers = threading.local()

    def __init__(self, response: urllib3.BaseHTTPResponse, length: int, what: str) -> None:
        self._response = response
        self._raw = getattr(response, "_fp", None)  # the http.client response, if urllib3 has one
        self._length = length
        self._what = what
        self.headers = response.headers

    @classmethod
    def _buffer(cls) -> memoryview:
        buffer = getattr(cls._buffers, "view", None)
        if buffer is None:
            buffer = cls._buffers.view = memoryview(bytearray(CHUNK_SIZE))
        return buffer

    def chunks(self) -> Iterator[memoryview]:
        if self._raw is None or not hasattr(self._raw, "readinto"):
            yield from self._stream_chunks()
            return
        buffer, received = self._buffer(), 0
        try:
            while received < self._length:
                count = self._raw.readinto(buffer[: min(CHUNK_SIZE, self._length - received)])
                if not count:
                    break
                received += count
                yield buffer[:count]
        except InitializerError:
            raise
        except Exception as exc:
            raise classify_exception(exc, self._what) from None
        self._check_length(received)

    def _stream_chunks(self) -> Iterator[memoryview]:
        """urllib3's public streaming API, for a urllib3 without the standard response."""
        received = 0
        try:
            for chunk in self._response.stream(CHUNK_SIZE):
                received += len(chunk)
                if received > self._length:
                    raise IntegrityError(f"{self._what}: the server sent more bytes than asked")
                yield memoryview(chunk)
        except InitializerError:
            raise
        except Exception as exc:
            raise classify_exception(exc, self._what) from None
        self._check_length(received)

    def _check_length(self, received: int) -> None:
        if received < self._length:
            raise TransientError(
                f"{self._what}: body ended after {received} of {self._length} bytes"
            )

    def close(self) -> None:
        finished = self._raw.isclosed() if self._raw is not None else self._response.isclosed()
        if finished:
            self._response.release_conn()
        else:
            _discard(self._response)


def _discard(response: urllib3.BaseHTTPResponse) -> None:
    """Give back the pool slot of a response whose body was not read to its end.

    Only a body read to its end lets its connection be reused: on a connection still holding
    an unread answer (an error's body, the rest of a range) the next request fails in
    http.client (``ResponseNotReady``), so one 503 would cost two attempts.
    """
    response.close()  # closes the connection too; the pool opens a fresh one for the next use
    response.release_conn()


def classify_exception(exc: BaseException, what: str) -> Exception:
    """Map a urllib3/socket failure to a typed error, with a message free of URLs."""
    reason: BaseException = exc.reason if isinstance(exc, MaxRetryError) and exc.reason else exc
    if isinstance(reason, SSLError | ssl.SSLError):
        return TlsRefused(tls_refused(what, "AWS_CA_BUNDLE"))
    if isinstance(reason, ProxyError):
        return TransientError(f"{what}: the HTTP proxy refused or dropped the connection")
    if isinstance(reason, NewConnectionError):  # before TimeoutError: urllib3 subclasses it
        detail = getattr(reason.__cause__, "strerror", None) or "no connection"
        return TransientError(f"{what}: cannot connect to the server ({detail})")
    if isinstance(reason, Urllib3Timeout | TimeoutError):  # urllib3's, or a socket's mid-body
        return TransientError(f"{what}: the server stalled past the timeout")
    if isinstance(reason, ProtocolError | ConnectionError | OSError):
        return TransientError(f"{what}: connection failed ({type(reason).__name__})")
    if isinstance(exc, MaxRetryError):
        return TransientError(f"{what}: too many redirects or retries")
    if isinstance(reason, HTTPError):
        return TransientError(f"{what}: HTTP transport error ({type(reason).__name__})")
    return exc if isinstance(exc, Exception) else RuntimeError(str(exc))

"""A fault-injecting HTTP proxy on 127.0.0.1, for proving the initializers survive a bad network.

It sits between a client and one local server (moto's S3, the test Hub or its CDN): point the
client's endpoint at ``proxy.url``. Every request is forwarded over a keep-alive connection of its
own; the answer is streamed back unchanged, except when the proxy decides to break it:

* ``Fault.error(500|503)`` — an S3-style XML error instead of the answer (``InternalError`` /
  ``ServiceUnavailable``); ``Fault.slowdown()`` is S3 throttling, 503 ``<Code>SlowDown</Code>``;
  either with ``retry_after=`` sends that ``Retry-After`` header (seconds or an HTTP date);
* ``Fault.reset(after_bytes)`` — the real headers, ``after_bytes`` of the body, then a TCP RST;
* ``Fault.short(after_bytes)`` — the real headers (full ``Content-Length``), part of the body, then
  a clean close: a body shorter than announced;
* ``Fault.stall(seconds, after_bytes=None)`` — nothing at all (or the headers and some body bytes),
  then silence for ``seconds`` before closing: a client without a read timeout hangs;
* ``Fault.outage(seconds)`` — the proxy goes away: this connection and every open one are reset
  and the port refuses connections for ``seconds``, then it listens again on the same port.

Faults come from two places. ``proxy.force(fault, times=n, match=...)`` queues exact ones for
targeted tests. With ``share > 0`` the proxy also breaks about that share of the requests
``match`` accepts; whether a request is hit is drawn from ``seed`` and the request's identity
(method, path, byte range and how often that identity was seen), so a rerun hits the same
requests whatever the thread interleaving. The kinds are taken in turn, so every
kind shows up once ``len(faults)`` faults were injected. ``max_in_a_row`` caps consecutive random
faults on one path so a source stays recoverable for a client that retries a few times; ``rate``
throttles each connection (bytes per second) to stretch a fetch out in time.

``hold(match)`` parks matching requests before they are forwarded until ``release()``, which
lets a test act (fill a disk, start a second client, plant a symlink) at a known point of a fetch.
``injected`` counts faults by kind; ``requests``, ``seen`` (per method and path), ``received``
(each request with its headers), ``body_bytes``
and ``log`` (the faults, in order) say what went through.

    with FaultProxy(s3_endpoint, seed=7, share=0.3, faults=every_fault(stall_seconds=30)) as proxy:
        run the client against proxy.url
        assert sum(proxy.injected.values()) > 0
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import random
import socket
import ssl
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

_CHUNK = 256 * 1024
_HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
}
_ERROR_CODES = {
    429: "TooManyRequests",
    500: "InternalError",
    502: "BadGateway",
    503: "ServiceUnavailable",
}

FaultKind = Literal["error", "slowdown", "reset", "short", "stall", "outage"]


@dataclass(frozen=True)
class Fault:
    """One way of breaking one request (see the module docstring)."""

    kind: FaultKind
    status: int = 503
    after_bytes: int | None = None
    seconds: float = 0.0
    retry_after: str | None = None

    @classmethod
    def error(cls, status: int = 503, retry_after: str | None = None) -> Fault:
        return cls("error", status=status, retry_after=retry_after)

    @classmethod
    def slowdown(cls, retry_after: str | None = None) -> Fault:
        return cls("slowdown", status=503, retry_after=retry_after)

    @classmethod
    def reset(cls, after_bytes: int = 0) -> Fault:
        return cls("reset", after_bytes=after_bytes)

    @classmethod
    def short(cls, after_bytes: int = 0) -> Fault:
        return cls("short", after_bytes=after_bytes)

    @classmethod
    def stall(cls, seconds: float = 30.0, after_bytes: int | None = None) -> Fault:
        return cls("stall", after_bytes=after_bytes, seconds=seconds)

    @classmethod
    def outage(cls, seconds: float = 2.0) -> Fault:
        return cls("outage", seconds=seconds)

    @property
    def label(self) -> str:
        """The counter name: ``error-500``, ``slowdown``, ``stall-mid-body``, ..."""
        if self.kind == "error":
            return f"error-{self.status}"
        if self.kind == "stall" and self.after_bytes is not None:
            return "stall-mid-body"
        return self.kind


@dataclass(frozen=True)
class Request:
    """What the proxy knows of one request when it decides its fate."""

    method: str
    path: str  # without the query string
    query: str
    headers: Mapping[str, str]  # lower-case names

    @property
    def range(self) -> str | None:
        return self.headers.get("range")


Matcher = Callable[[Request], bool]


def _any_request(request: Request) -> bool:
    return True


class _Dropped(Exception):
    """The client connection was broken on purpose (or by the client): stop serving it."""


class FaultProxy:
    """See the module docstring."""

    def __init__(
        self,
        upstream: str,
        *,
        seed: int = 0,
        share: float = 0.0,
        faults: Iterable[Fault] = (),
        match: Matcher = _any_request,
        max_in_a_row: int = 2,
        rewrite_location: Mapping[str, str] | None = None,
        rate: float | None = None,
        keep_alive: bool = False,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        parts = urlsplit(upstream)
        if parts.scheme != "http" or not parts.hostname or not parts.port:
            raise ValueError(f"upstream must be http://host:port, got {upstream!r}")
        self.upstream = (parts.hostname, parts.port)
        self.seed = seed
        self.share = share
        self.faults = tuple(faults)
        if share and not self.faults:
            raise ValueError("share > 0 needs at least one fault to draw from")
        self.match = match
        self.max_in_a_row = max_in_a_row
        self.rewrite_location = dict(rewrite_location or {})
        self.rate = rate  # bytes/s per connection, None for as fast as it goes
        # Keep client connections alive, as S3 and CDNs do, even where the upstream (moto's
        # HTTP/1.0 server) closes each one after a response: the proxy reconnects upstream.
        self.keep_alive = keep_alive
        self.tls = tls  # serve https with this context (the upstream stays http)
        self.handshakes_refused = 0  # TLS handshakes the client gave up on
        self.injected: Counter[str] = Counter()
        self.requests = 0
        self.connections = 0  # client connections accepted
        self.seen: Counter[str] = Counter()  # "METHOD /path" -> requests received
        self.received: list[Request] = []  # every request, with its headers
        self.body_bytes = 0
        self.log: list[tuple[str, str, str, str | None]] = []  # (fault, method, path, range)
        self._lock = threading.Lock()
        self._seen: Counter[str] = Counter()
        self._in_a_row: Counter[str] = Counter()
        self._turn = 0
        self._forced: list[tuple[Fault, Matcher]] = []
        self._held: Matcher | None = None
        self._release = threading.Event()
        self._parked = 0
        self._closing = threading.Event()
        self._away_until = 0.0
        self._listener: socket.socket | None = None
        self._port = 0
        self._clients: set[socket.socket] = set()
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> FaultProxy:
        self._listener = self._listen(0)
        self._port = self._listener.getsockname()[1]
        self._thread = threading.Thread(target=self._serve, name="faultproxy", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._closing.set()
        self._release.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._lock:
            clients = list(self._clients)
        for client in clients:
            _cut(client)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self._port}"

    # -- controls --------------------------------------------------------------------------------

    def force(self, fault: Fault, times: int = 1, match: Matcher = _any_request) -> None:
        """Apply ``fault`` to the next ``times`` requests that ``match`` accepts."""
        with self._lock:
            self._forced.extend([(fault, match)] * times)

    def go_away(self, seconds: float) -> None:
        """Stop listening and reset every open connection; listen again after ``seconds``."""
        with self._lock:
            self._away_until = max(self._away_until, time.monotonic() + seconds)
            clients = list(self._clients)
            if self._listener is not None:
                # Refuse from now on; the accept loop then closes it and reopens it later.
                with contextlib.suppress(OSError):
                    self._listener.shutdown(socket.SHUT_RDWR)
        for client in clients:
            _cut(client)

    def hold(self, match: Matcher = _any_request) -> None:
        """Park the requests ``match`` accepts, before forwarding them, until :meth:`release`."""
        self._release.clear()
        self._held = match

    def release(self) -> None:
        self._held = None
        self._release.set()

    def wait_parked(self, count: int = 1, timeout: float = 30.0) -> None:
        """Block until at least ``count`` requests are parked by :meth:`hold`."""
        deadline = time.monotonic() + timeout
        while self._parked < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self._parked} request(s) parked, expected {count}")
            time.sleep(0.01)

    @property
    def parked(self) -> int:
        """Requests parked by :meth:`hold` right now: what the client has in flight."""
        return self._parked

    @property
    def total_injected(self) -> int:
        return sum(self.injected.values())

    # -- listening -------------------------------------------------------------------------------

    def _listen(self, port: int) -> socket.socket:
        sock = socket.create_server(("127.0.0.1", port), backlog=128)  # SO_REUSEADDR on POSIX
        sock.settimeout(0.05)
        return sock

    def _serve(self) -> None:
        """Accept connections; owns the listening socket, so outages close and reopen it here."""
        while not self._closing.is_set():
            with self._lock:
                away = time.monotonic() < self._away_until
                if away and self._listener is not None:
                    self._listener.close()  # the port now refuses connections
                    self._listener = None
                listener = self._listener
            if away:
                self._closing.wait(0.02)
                continue
            if listener is None:
                try:
                    listener = self._listen(self._port)
                except OSError:  # the old socket's port is not free yet
                    self._closing.wait(0.05)
                    continue
                with self._lock:
                    self._listener = listener
            try:
                client, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                continue
            client.settimeout(None)
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._clients.add(client)
                self.connections += 1
            threading.Thread(target=self._handle, args=(client,), daemon=True).start()
        if self._listener is not None:
            self._listener.close()

    # -- one client connection -------------------------------------------------------------------

    def _handle(self, client: socket.socket) -> None:
        if self.tls is not None:
            try:
                secured = self.tls.wrap_socket(client, server_side=True)
            except OSError:  # ssl.SSLError too: the client refused the certificate
                with self._lock:
                    self.handshakes_refused += 1
                    self._clients.discard(client)
                client.close()
                return
            with self._lock:
                self._clients.discard(client)
                self._clients.add(secured)
            client = secured
        upstream: http.client.HTTPConnection | None = None
        reader = client.makefile("rb")
        try:
            while not self._closing.is_set():
                parsed = _read_request(reader)
                if parsed is None:
                    return
                request, body = parsed
                self._park_if_held(request)
                fault = self._decide(request)
                if fault is not None and self._break_before_forwarding(client, fault):
                    return
                if fault is not None and fault.kind in ("error", "slowdown"):
                    continue  # answered; the connection stays usable
                if upstream is None:
                    upstream = http.client.HTTPConnection(*self.upstream, timeout=60)
                try:
                    upstream.request(
                        request.method, _target(request), body=body, headers=_forwarded(request)
                    )
                    response = upstream.getresponse()
                except (OSError, http.client.HTTPException):
                    upstream.close()
                    upstream = None
                    _send(client, _error_response(502, "BadGateway"))
                    continue
                keep = self._relay(client, request, response, fault)
                if not keep or response.will_close:
                    upstream.close()
                    upstream = None
                if not keep:
                    return
        except _Dropped:
            return
        except OSError:  # the client hung up
            return
        finally:
            if upstream is not None:
                upstream.close()
            reader.close()
            with self._lock:
                self._clients.discard(client)
            with contextlib.suppress(OSError):
                client.close()

    def _park_if_held(self, request: Request) -> None:
        held = self._held
        if held is None or not held(request):
            return
        with self._lock:
            self._parked += 1
        try:
            self._release.wait()
        finally:
            with self._lock:
                self._parked -= 1

    def _break_before_forwarding(self, client: socket.socket, fault: Fault) -> bool:
        """Apply the faults that need no upstream answer; True when the connection is gone."""
        if fault.kind == "error":
            code = _ERROR_CODES.get(fault.status, "Error")
            _send(client, _error_response(fault.status, code, retry_after=fault.retry_after))
        elif fault.kind == "slowdown":
            message = "Please reduce your request rate."
            _send(client, _error_response(503, "SlowDown", message, fault.retry_after))
        elif fault.kind == "outage":
            self.go_away(fault.seconds)
            return True
        elif fault.kind == "stall" and fault.after_bytes is None:
            self._closing.wait(fault.seconds)
            _reset(client)
            return True
        return False

    def _relay(
        self,
        client: socket.socket,
        request: Request,
        response: http.client.HTTPResponse,
        fault: Fault | None,
    ) -> bool:
        """Send the upstream answer to the client, broken by ``fault``; True to keep going."""
        headers = [(k, v) for k, v in response.getheaders() if k.lower() not in _HOP_BY_HOP]
        chunked = response.getheader("transfer-encoding", "").lower() == "chunked"
        body_whole = response.read() if chunked else None
        if body_whole is not None:
            headers = [(k, v) for k, v in headers if k.lower() != "content-length"]
            headers.append(("Content-Length", str(len(body_whole))))
        headers = [(k, self._rewrite(v) if k.lower() == "location" else v) for k, v in headers]
        framed = body_whole is not None or response.getheader("content-length") is not None
        close = response.will_close and not (self.keep_alive and framed)
        if (
            fault is not None
            and fault.after_bytes is not None
            and (_body_length(request, response, body_whole) == 0)
        ):
            _reset(client)  # no body to cut short: break the connection instead of answering
            raise _Dropped
        head = [f"HTTP/1.1 {response.status} {response.reason}"]
        head += [f"{k}: {v}" for k, v in headers]
        head.append("Connection: close" if close else "Connection: keep-alive")
        _send(client, ("\r\n".join(head) + "\r\n\r\n").encode("latin-1"))
        cut = fault.after_bytes if fault is not None else None
        if cut is not None:
            cut = min(cut, _body_length(request, response, body_whole) - 1)
        sent = 0
        while True:
            chunk = body_whole if body_whole is not None else response.read(_CHUNK)
            body_whole = b"" if body_whole is not None else None
            if not chunk:
                break
            if cut is not None and sent + len(chunk) >= cut:
                self._send_body(client, chunk[: cut - sent])
                self._finish_broken(client, fault)  # type: ignore[arg-type]
                return False
            self._send_body(client, chunk)
            sent += len(chunk)
        if cut is not None:  # the body was shorter than the cut: break it at its end
            self._finish_broken(client, fault)  # type: ignore[arg-type]
            return False
        return not close

    def _send_body(self, client: socket.socket, data: bytes) -> None:
        if data:
            with self._lock:  # counted first: a client that has the bytes sees them counted
                self.body_bytes += len(data)
            _send(client, data)
            if self.rate:
                self._closing.wait(len(data) / self.rate)

    def _finish_broken(self, client: socket.socket, fault: Fault) -> None:
        if fault.kind == "reset":
            _reset(client)
        elif fault.kind == "short":
            with contextlib.suppress(OSError):
                client.shutdown(socket.SHUT_WR)
        elif fault.kind == "stall":
            self._closing.wait(fault.seconds)
            _reset(client)
        raise _Dropped

    def _rewrite(self, location: str) -> str:
        for old, new in self.rewrite_location.items():
            if location.startswith(old):
                return new + location[len(old) :]
        return location

    # -- deciding --------------------------------------------------------------------------------

    def _decide(self, request: Request) -> Fault | None:
        with self._lock:
            self.requests += 1
            self.seen[f"{request.method} {request.path}"] += 1
            self.received.append(request)
            fault = self._take_forced(request)
            if fault is None and self.share > 0 and self.match(request):
                fault = self._draw(request)
            if fault is not None:
                self.injected[fault.label] += 1
                self.log.append((fault.label, request.method, request.path, request.range))
            return fault

    def _take_forced(self, request: Request) -> Fault | None:
        for index, (fault, match) in enumerate(self._forced):
            if match(request):
                del self._forced[index]
                return fault
        return None

    def _draw(self, request: Request) -> Fault | None:
        identity = f"{request.method} {request.path} {request.range}"
        self._seen[identity] += 1
        digest = hashlib.sha256(f"{self.seed}|{identity}|{self._seen[identity]}".encode())
        rng = random.Random(digest.digest())
        streak = f"{request.method} {request.path}"
        if rng.random() >= self.share or self._in_a_row[streak] >= self.max_in_a_row:
            self._in_a_row[streak] = 0
            return None
        self._in_a_row[streak] += 1
        fault = self.faults[self._turn % len(self.faults)]  # kinds in turn: each one shows up
        self._turn += 1
        if fault.kind in ("reset", "short") or (fault.kind == "stall" and fault.after_bytes):
            # Break somewhere inside the body, not always at the same offset.
            fault = Fault(fault.kind, fault.status, rng.randrange(1, 4 << 20), fault.seconds)
        return fault


# A mix for "inject everything at random": each kind once, with short outages and stalls.
def every_fault(stall_seconds: float = 30.0, outage_seconds: float = 1.5) -> tuple[Fault, ...]:
    return (
        Fault.reset(1),
        Fault.error(500),
        Fault.error(503),
        Fault.slowdown(),
        Fault.short(1),
        Fault.stall(stall_seconds),
        Fault.stall(stall_seconds, after_bytes=1),
        Fault.outage(outage_seconds),
    )


# -- HTTP plumbing --------------------------------------------------------------------------------


def _read_request(reader) -> tuple[Request, bytes] | None:  # type: ignore[no-untyped-def]
    line = reader.readline(65537)
    if not line:
        return None
    try:
        method, target, _ = line.decode("latin-1").split(" ", 2)
    except ValueError:
        raise _Dropped from None
    message = http.client.parse_headers(reader)
    headers = {k.lower(): v for k, v in message.items()}
    length = int(headers.get("content-length") or 0)
    body = reader.read(length) if length else b""
    path, _, query = target.partition("?")
    return Request(method, path, query, headers), body


def _target(request: Request) -> str:
    return f"{request.path}?{request.query}" if request.query else request.path


def _forwarded(request: Request) -> dict[str, str]:
    """The client's headers minus hop-by-hop ones; ``Host`` is kept (it is signed by SigV4)."""
    return {k: v for k, v in request.headers.items() if k not in _HOP_BY_HOP}


def _body_length(request: Request, response: http.client.HTTPResponse, body: bytes | None) -> int:
    if request.method == "HEAD" or response.status in (204, 304):
        return 0
    if body is not None:
        return len(body)
    return int(response.getheader("content-length") or 0)


def _error_response(
    status: int, code: str, message: str = "Injected fault", retry_after: str | None = None
) -> bytes:
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>{message}</Message>"
        "<RequestId>faultproxy</RequestId></Error>"
    ).encode()
    reason = http.client.responses.get(status, "Error")
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/xml\r\n"
        f"Content-Length: {len(body)}\r\nConnection: keep-alive\r\n"
        + (f"Retry-After: {retry_after}\r\n" if retry_after is not None else "")
        + "\r\n"
    )
    return head.encode() + body


def _send(client: socket.socket, data: bytes) -> None:
    try:
        client.sendall(data)
    except OSError:
        raise _Dropped from None


def _reset(sock: socket.socket) -> None:
    """Close with a TCP RST (SO_LINGER 0), as a crashed peer or a middlebox does.

    Called by the connection's own thread; the close takes effect when its reader is closed too.
    """
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()


def _cut(sock: socket.socket) -> None:
    """Break a connection another thread is serving: wake it up; its final close sends a RST."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)

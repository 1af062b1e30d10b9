"""Wait until peers resolve and accept TCP connections (torch master, every host's sshd).

Each round probes the endpoints still pending, in parallel, with a short connect timeout; an
endpoint that must speak first (sshd sends ``SSH-2.0-...``) can be required to show its banner,
so a port that is open but not yet serving does not count as ready.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from initializers.errors import UnavailableError
from initializers.launchers.polling import wait_until_ready

CONNECT_TIMEOUT = 2.0
MAX_PARALLEL_PROBES = 32


@dataclass(frozen=True)
class Endpoint:
    """A peer to wait for.

    ``banner``: the prefix it must send first, when it speaks first. ``resolve_only``: only its
    name must resolve (a node waiting for its own name before it starts serving on it).
    """

    host: str
    port: int
    role: str = "peer"
    banner: bytes | None = None
    resolve_only: bool = False

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.role} {host}:{self.port}"


def probe(endpoint: Endpoint, timeout: float = CONNECT_TIMEOUT) -> str | None:
    """None when ``endpoint`` is ready, else why not (one short phrase naming it)."""
    try:
        infos = socket.getaddrinfo(endpoint.host, endpoint.port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        return f"{endpoint} does not resolve ({exc.strerror})"
    if endpoint.resolve_only:
        return None
    last = "no address"
    for family, kind, proto, _, address in infos:
        try:
            with socket.socket(family, kind, proto) as sock:
                sock.settimeout(timeout)
                sock.connect(address)
                if endpoint.banner is None:
                    return None
                greeting = sock.recv(len(endpoint.banner))
                if greeting.startswith(endpoint.banner):
                    return None
                last = f"answered without the expected {endpoint.banner!r} greeting"
        except TimeoutError:
            last = "timed out"
        except OSError as exc:
            last = exc.strerror or type(exc).__name__
    return f"{endpoint} not accepting connections ({last})"


def _pending(endpoints: Sequence[Endpoint]) -> list[str]:
    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL_PROBES, len(endpoints))) as pool:
        return [problem for problem in pool.map(probe, endpoints) if problem]


def wait_for_endpoints(endpoints: Sequence[Endpoint], timeout: float, what: str) -> None:
    """Block until every endpoint is ready; raise UnavailableError naming the rest after timeout."""
    if not endpoints:
        return
    problems = wait_until_ready(lambda: _pending(endpoints), what=what, timeout=timeout)
    if problems:
        raise UnavailableError(
            f"{what} not reachable after {timeout:g}s: {'; '.join(problems)}; check that those "
            "pods are running and their names resolve, or raise --peer-timeout (KF_PEER_TIMEOUT)"
        )

"""Ending reads that wait inside a native library: this process's client connections are shut.

A read blocked in Rust (the native client's blocking reads, :mod:`initializers.native`) cannot
be interrupted from Python, and its socket is not ours to reach. A ``shutdown`` of the socket
ends the read at once, with an error its caller takes for the stop. Every connected TCP socket
of this process is cut, except those a listener of this process accepted (a test's server
running in the same process keeps its side); the file descriptors are only shut down, never
closed, so their owners close them as usual.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator

_TCP = (socket.AF_INET, socket.AF_INET6)


def _tcp_connections() -> Iterator[tuple[int, bool, socket.socket]]:
    """This process's TCP sockets: each one's local port, whether it listens, and a duplicate of
    it for the caller to shut down and close.

    Another thread may close any of them meanwhile (and its number may be reused at once): a
    socket gone mid-look is passed over, and every question is asked of the duplicate.
    """
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return
    for name in names:
        try:
            if not os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                continue
            sock = socket.socket(fileno=os.dup(int(name)))
        except (OSError, ValueError):
            continue
        try:
            if sock.family in _TCP and sock.type == socket.SOCK_STREAM:
                port = sock.getsockname()[1]
                listens = bool(sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN))
                yield port, listens, sock
                continue
        except OSError:
            pass
        sock.close()


def cut_client_connections() -> None:
    """Shut down every connection of this process that a listener of its own did not accept."""
    listening: set[int] = set()
    connected: list[tuple[int, socket.socket]] = []
    for port, listens, sock in _tcp_connections():
        if listens:
            listening.add(port)
            sock.close()
        else:
            connected.append((port, sock))
    for port, sock in connected:
        with contextlib.suppress(OSError), sock:
            if port not in listening:
                sock.shutdown(socket.SHUT_RDWR)


def cut_while(busy: Callable[[], bool], every: float) -> None:
    """Cut the client connections now and again every ``every`` seconds while ``busy()``, on a
    thread of its own: a connection opened just after a cut (by a read that had started) is
    cut by the next."""

    def keep_cutting() -> None:
        while busy():
            cut_client_connections()
            time.sleep(every)

    threading.Thread(target=keep_cutting, name="hangup", daemon=True).start()

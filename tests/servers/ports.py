"""Waiting for a server a test started to listen on its port."""

from __future__ import annotations

import socket
import time


def free_port() -> int:
    """A port on 127.0.0.1 nobody listens on now (for a server that takes its port as a flag)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for_port(port: int, seconds: float, what: str, host: str = "127.0.0.1") -> None:
    """Return once ``host``:``port`` accepts a connection; RuntimeError after ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} did not start listening on port {port} within {seconds:g} s")

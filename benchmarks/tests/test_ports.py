"""Ports the harness picks for nginx stay its own until nginx binds them."""

from __future__ import annotations

import errno
import socket

import pytest

from benchmarks.nginx import HeldPorts


def _bind_like_a_python_server(port: int) -> socket.socket:
    """Bind as ``http.server`` does: with ``SO_REUSEADDR``, as every server the harness runs."""
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", port))
    return server


def test_a_held_port_cannot_be_bound_by_another_server_until_released() -> None:
    held = HeldPorts()
    port = held.take()
    with pytest.raises(OSError) as refused:
        _bind_like_a_python_server(port)
    assert refused.value.errno == errno.EADDRINUSE
    held.release()
    _bind_like_a_python_server(port).close()

"""A stop shuts down this process's client connections, and leaves its servers' sides alone.

What :mod:`initializers.hangup` does for reads blocked inside the native client, shown on plain
sockets: a read waiting on a connection that the stop cuts returns at once, while a connection
that a listener of this same process accepted (a test's server) stays as it was.
"""

from __future__ import annotations

import socket
import threading
import time

from initializers import hangup


def connected_pair() -> tuple[socket.socket, socket.socket, socket.socket]:
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    accepted, _ = listener.accept()
    return listener, client, accepted


def test_a_read_blocked_on_a_client_connection_returns_at_once_when_the_connections_are_cut():
    listener, client, accepted = connected_pair()
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(client.recv(1)))
    with listener, client, accepted:
        reader.start()
        time.sleep(0.2)  # the read now waits: the server sends nothing
        started = time.monotonic()
        hangup.cut_client_connections()
        reader.join(5)
        assert not reader.is_alive()
        assert got == [b""]
        assert time.monotonic() - started < 1.0


def test_the_side_a_listener_of_this_process_accepted_is_not_shut_down():
    listener, client, accepted = connected_pair()
    with listener, client, accepted:
        hangup.cut_client_connections()
        assert accepted.send(b"x") == 1  # a shut-down side refuses to send (EPIPE)
        with socket.create_connection(listener.getsockname()) as later:  # still listening
            assert later.getpeername() == listener.getsockname()


def test_cutting_goes_on_while_reads_are_busy_and_ends_after():
    busy = threading.Event()
    busy.set()
    listener, client, accepted = connected_pair()
    with listener, client, accepted:
        hangup.cut_while(busy.is_set, every=0.05)
        client.settimeout(5)
        assert client.recv(1) == b""  # cut by the first round
        listener2, client2, accepted2 = connected_pair()  # opened after the first cut
        with listener2, client2, accepted2:
            client2.settimeout(5)
            assert client2.recv(1) == b""  # cut by a later round
            busy.clear()
            time.sleep(0.2)
            assert not any(t.name == "hangup" for t in threading.enumerate())


def test_a_socket_closed_by_another_thread_while_the_cut_looks_at_it_is_passed_over():
    # A CI run's stop printed a traceback: a socket closed between the look at /proc/self/fd
    # and the question asked of it. Another thread here opens and closes sockets all along.
    churning = threading.Event()
    churning.set()
    pairs = 0

    def churn() -> None:
        nonlocal pairs
        while churning.is_set():
            try:  # the cut may shut a socket down before it listens or connects: that is its job
                listener, client, accepted = connected_pair()
            except OSError:
                continue
            for sock in (client, accepted, listener):
                sock.close()
            pairs += 1

    churner = threading.Thread(target=churn)
    churner.start()
    try:
        for _ in range(2000):
            hangup.cut_client_connections()
    finally:
        churning.clear()
        churner.join(5)
    assert pairs > 100  # the sockets did come and go while the cuts looked

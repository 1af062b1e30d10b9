"""Worker processes for runs of many small files, so Python runs on every core.

A run of many small files is bound by the interpreter: each file costs about 0.8 ms of Python
(request, headers, open, verify, commit), and threads take turns under the GIL. Forking after
planning lets each process work through its own share with its own GIL: in interleaved runs of
the 2,002-file benchmark dataset on two cores (medians of 4), two processes took 3.75 s instead
of 4.51 s on the Hub and 3.04 s instead of 3.51 s on S3. Large files, fetched in parallel
ranges, stay with the parent, whose threads already keep the network busy.

A child fetches and commits its files exactly as the parent would, forwards progress, and ends
by sending its commit records or its error; it never writes the manifest, never reports to the
user and never returns into the caller (``os._exit``). It dies with the parent (PDEATHSIG), takes
SIGTERM from it, and shares the parent's destination lock (an inherited flock).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pickle
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection, Pipe, wait
from typing import Any

from initializers.cpus import available_cpus
from initializers.errors import ExitCode, InitializerError
from initializers.interrupts import interrupt_reads

FILES_PER_PROCESS = 64  # fewer single-range files than this per process: threads suffice
MAX_PROCESSES = 4
UNCOUNTED = 1 << 20  # small files a listing still arriving is taken to hold: all the processes
FLUSH_BYTES = 16 << 20  # a child forwards progress after this many bytes...
FLUSH_SECONDS = 0.5  # ...or this long, whichever comes first
_PR_SET_PDEATHSIG = 1
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def usable_cpus() -> int:
    """CPUs this process may run on (:func:`initializers.cpus.available_cpus`: its affinity,
    capped by a cgroup v1 or v2 CPU quota); 1 where the platform cannot fork."""
    if not hasattr(os, "sched_getaffinity") or not hasattr(os, "fork"):
        return 1
    return available_cpus()


_fork_forbidden = False  # set for good once something started here would not survive a fork


def forbid_fork() -> None:
    """From now on this process shares its files with no forked worker: something started here
    (a native client's runtime threads) would not survive into a child."""
    global _fork_forbidden
    _fork_forbidden = True


def process_count(small_files: int, workers: int) -> int:
    """How many processes (the parent included) should share ``small_files`` files among
    ``workers`` parallel requests."""
    if _fork_forbidden:
        return 1
    return max(1, min(MAX_PROCESSES, usable_cpus(), workers, small_files // FILES_PER_PROCESS))


class ForwardedProgress:
    """A child's progress counters, sent to the parent in batches (every few MiB or a fraction
    of a second) instead of kept: a message per file would cost the parent a wake-up each."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._lock = threading.Lock()
        self._bytes = 0
        self._files = 0
        self._sent = time.monotonic()

    def add_bytes(self, n: int) -> None:
        with self._lock:
            self._bytes += n
            self._flush_if_due()

    def file_done(self) -> None:
        with self._lock:
            self._files += 1
            self._flush_if_due()

    def flush(self) -> None:
        with self._lock:
            self._send()

    def _flush_if_due(self) -> None:
        if self._bytes >= FLUSH_BYTES or time.monotonic() - self._sent >= FLUSH_SECONDS:
            self._send()

    def _send(self) -> None:
        self._conn.send(("progress", self._bytes, self._files))
        self._bytes = self._files = 0
        self._sent = time.monotonic()


@dataclass
class Child:
    pid: int
    conn: Connection
    result: dict[str, Any] | None = None
    error: BaseException | None = None
    status: int | None = None  # from waitpid, once reaped


def fork(work: Callable[[ForwardedProgress], dict[str, Any]], stop: threading.Event) -> Child:
    """Run ``work`` in a forked child; its result (or error) comes back through :func:`gather`.

    Call with no other thread of this process running: a fork copies only the calling thread.
    """
    receive, send = Pipe(duplex=False)
    # Held until the child has its own handlers, so a stop in between reaches it, not the copy
    # of the parent's handler it starts with; the parent takes its own stop right after the fork.
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    parent = os.getpid()
    try:
        pid = os.fork()
    except BaseException:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        raise
    if pid:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        send.close()
        return Child(pid, receive)
    code = ExitCode.UNEXPECTED
    try:
        receive.close()
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the parent died before PDEATHSIG was armed: no one to tell
            os._exit(ExitCode.INTERRUPTED)
        for signum in _STOP_SIGNALS:
            signal.signal(signum, lambda *_: _stop_now(stop))
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        progress = ForwardedProgress(send)
        result = work(progress)
        progress.flush()
        send.send(("done", result))
        code = ExitCode.OK
    except BaseException as exc:  # every failure goes to the parent, which reports it
        code = getattr(exc, "exit_code", ExitCode.UNEXPECTED)
        with contextlib.suppress(Exception):
            send.send(("error", _portable(exc)))
    finally:
        os._exit(code)


def _stop_now(stop: threading.Event) -> None:
    """Stop this process's workers without waiting out a slow read: on SIGTERM in a child, and
    in the parent when a child failed."""
    stop.set()
    interrupt_reads()


def _portable(exc: BaseException) -> BaseException:
    """``exc`` if the parent can rebuild it from a pickle, else a plain InitializerError."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return InitializerError(f"a worker process failed: {type(exc).__name__}: {exc}")


def gather(
    children: list[Child],
    stop: threading.Event,
    on_progress: Callable[[int, int], None],
) -> None:
    """Relay the children's progress until each has sent its result or error and exited.

    A child that fails sets ``stop`` and cuts the parent's reads, so the parent's own workers
    end at once too; once ``stop`` is set (that failure, the parent's own, or a signal) every
    child still running gets SIGTERM.
    """
    waiting = {child.conn: child for child in children}
    signalled = False
    while waiting:
        if stop.is_set() and not signalled:
            signalled = True
            for child in waiting.values():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child.pid, signal.SIGTERM)
        for conn in wait(list(waiting), timeout=0.2):
            child = waiting[conn]  # type: ignore[index]
            try:
                message = conn.recv()  # type: ignore[union-attr]
            except (EOFError, OSError):  # the child has exited
                _reap(child)
                if child.result is None and child.error is None:
                    child.error = InitializerError(
                        f"a worker process {_describe(child.status)} before reporting "
                        "(out of memory?); rerun to resume (finished files are kept)"
                    )
                    _stop_now(stop)
                del waiting[conn]  # type: ignore[arg-type]
                continue
            if message[0] == "progress":
                on_progress(message[1], message[2])
            elif message[0] == "done":
                child.result = message[1]
            else:
                child.error = message[1]
                _stop_now(stop)
    for child in children:
        _reap(child)
        child.conn.close()


def _reap(child: Child) -> None:
    if child.status is None:
        child.status = os.waitpid(child.pid, 0)[1]


def _describe(status: int | None) -> str:
    if status is not None and os.WIFSIGNALED(status):
        return f"was killed by {signal.Signals(os.WTERMSIG(status)).name}"
    code = os.WEXITSTATUS(status) if status is not None else "?"
    return f"exited with code {code}"

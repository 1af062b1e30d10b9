"""Run one contender as a process tree and measure it: wall, CPU, peak memory, bytes written.

CPU seconds come from ``wait4`` (the kernel's accounting of the child and every descendant it
reaped). The peak RSS of the largest process comes from GNU time's ``%M``: the contender is
started by ``/usr/bin/time``, a 2 MiB process, because a child's ``ru_maxrss`` otherwise starts at
the RSS of whoever forked it (here, this harness). Contenders that fan out into processes
(KServe's pool, eight curls) are also polled: the sum of PSS over the live tree, so shared
copy-on-write pages are counted once. Peak memory is the larger of the two. Bytes written
(``wchar`` of the tree) drive the kill of the resume scenario. Between polls the harness waits
on a pidfd, so the wall time ends when the process does, not at the next poll. The spawn's
wall-clock time is kept too, to compare with the endpoints' access log (when the first data GET
arrived).
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

MiB = 1 << 20
GNU_TIME = "/usr/bin/time"


@dataclass
class Measurement:
    """What one run of one contender cost."""

    wall_s: float
    cpu_s: float
    peak_rss_mib: float
    returncode: int
    started_at: float = 0.0  # epoch seconds, just before the spawn (nginx's log clock)
    killed: bool = False
    written_at_kill: int = 0
    log_tail: str = ""


class _Tree:
    """psutil handles for the descendants of a process, refreshed on each poll."""

    def __init__(self, pid: int, *, include_root: bool) -> None:
        self.root = psutil.Process(pid)
        self.procs: dict[int, psutil.Process] = {pid: self.root} if include_root else {}
        self.finished_wchar = 0
        self.last_wchar: dict[int, int] = {}

    def poll(self) -> tuple[int, int]:
        """(sum of PSS, sum of bytes written) over the live tree; exited children's writes kept."""
        try:
            for child in self.root.children(recursive=True):
                self.procs.setdefault(child.pid, child)
        except psutil.Error:
            pass
        rss = 0
        for pid, proc in list(self.procs.items()):
            try:
                with proc.oneshot():
                    rss += proc.memory_full_info().pss
                    self.last_wchar[pid] = proc.io_counters().write_chars
            except psutil.Error:
                self.finished_wchar += self.last_wchar.pop(pid, 0)
                del self.procs[pid]
        return rss, self.finished_wchar + sum(self.last_wchar.values())


def run(
    argv: list[str],
    env: dict[str, str],
    log: Path,
    *,
    kill_after_written: int | None = None,
    kill_when: Callable[[], bool] | None = None,
    timeout_s: float = 1800,
    cwd: Path | None = None,
) -> Measurement:
    """Run ``argv`` to completion (or SIGKILL its group once it wrote ``kill_after_written``,
    or once ``kill_when()`` says so: it is asked at every poll)."""
    poll_s = 0.02 if kill_after_written or kill_when else 0.1
    stats = log.with_suffix(".time")
    stats.unlink(missing_ok=True)
    wrapped = os.path.exists(GNU_TIME)
    if wrapped:
        argv = [GNU_TIME, "-f", "%M", "-o", str(stats), *argv]
    with open(log, "wb") as out:
        started_at = time.time()
        start = time.perf_counter()
        proc = subprocess.Popen(
            argv,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=cwd,
        )
        exited = os.pidfd_open(proc.pid)  # readable once the child exits: wall time is exact
        try:
            tree = _Tree(proc.pid, include_root=not wrapped)
            peak_rss, killed, written = 0, False, 0
            while True:
                pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
                if pid:
                    break
                rss, written = tree.poll()
                peak_rss = max(peak_rss, rss)
                elapsed = time.perf_counter() - start
                if (
                    (kill_after_written is not None and written >= kill_after_written)
                    or (kill_when is not None and kill_when())
                    or elapsed > timeout_s
                ):
                    os.killpg(proc.pid, signal.SIGKILL)
                    killed = True
                    pid, status, usage = os.wait4(proc.pid, 0)
                    break
                select.select([exited], [], [], poll_s)
            wall = time.perf_counter() - start
        finally:
            os.close(exited)
        proc.returncode = os.waitstatus_to_exitcode(status)
    if killed:
        _reap_group(proc.pid)
    tail = log.read_bytes()[-3000:].decode(errors="replace")
    largest = usage.ru_maxrss * 1024 if not wrapped else 0
    if wrapped and stats.exists():
        lines = stats.read_text().split()
        largest = int(lines[-1]) * 1024 if lines and lines[-1].isdigit() else 0
    return Measurement(
        wall_s=wall,
        cpu_s=usage.ru_utime + usage.ru_stime,
        peak_rss_mib=max(peak_rss, largest) / MiB,
        returncode=proc.returncode,
        started_at=started_at,
        killed=killed,
        written_at_kill=written if killed else 0,
        log_tail=tail,
    )


def _reap_group(pgid: int) -> None:
    """Make sure nothing of a killed contender's process group outlives it."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            return
        time.sleep(0.05)

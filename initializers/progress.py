"""Progress: counters the engine bumps, and a reporter that shows them.

The engine always gets a :class:`Progress` and never checks for None. Off a TTY (``kubectl
logs``), a line every few seconds: files, bytes, MiB/s, ETA. On a TTY, the same line redrawn
in place twice a second.
"""

from __future__ import annotations

import logging
import shutil
import sys
import threading
import time
from dataclasses import dataclass

log = logging.getLogger("initializers.progress")

MIB = 1 << 20


def human_bytes(n: float, digits: int = 2) -> str:
    """The one byte formatter: ``n`` in B, KiB, ... TiB, with ``digits`` after the point."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.{digits}f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def human_seconds(s: float) -> str:
    s = int(s)
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


@dataclass(frozen=True)
class Snapshot:
    files_done: int
    files_total: int
    bytes_done: int
    bytes_total: int
    bytes_fetched: int  # transferred by this run (excludes what was already in place)
    elapsed: float
    listing: bool = False  # the totals grow: the listing is still arriving


class Progress:
    """Thread-safe counters for one run."""

    def __init__(
        self,
        files_total: int,
        bytes_total: int,
        bytes_present: int,
        files_present: int = 0,
        listing: bool = False,
    ) -> None:
        self._lock = threading.Lock()
        self._listing = listing
        self._files_total = files_total
        self._bytes_total = bytes_total
        self._bytes_present = bytes_present
        self._files_done = files_present
        self._fetched = 0
        self._started = time.monotonic()

    def add_bytes(self, n: int) -> None:
        with self._lock:
            self._fetched += n

    def file_done(self) -> None:
        self.add_counts(0, 1)

    def add_counts(self, fetched: int, files: int) -> None:
        """Bytes fetched and files done elsewhere (a worker process), in one step."""
        with self._lock:
            self._fetched += fetched
            self._files_done += files

    def grow(self, files: int, size: int, bytes_present: int, files_present: int) -> None:
        """More files listed: ``files`` of ``size`` bytes, of which some are in place."""
        with self._lock:
            self._files_total += files
            self._bytes_total += size
            self._bytes_present += bytes_present
            self._files_done += files_present

    def listed(self) -> None:
        """The listing is complete: the totals are final."""
        self._listing = False

    def snapshot(self) -> Snapshot:
        with self._lock:
            return Snapshot(
                self._files_done,
                self._files_total,
                min(self._bytes_present + self._fetched, self._bytes_total),
                self._bytes_total,
                self._fetched,
                time.monotonic() - self._started,
                self._listing,
            )


def format_line(label: str, snap: Snapshot, rate: float) -> str:
    pct = 100.0 * snap.bytes_done / snap.bytes_total if snap.bytes_total else 100.0
    remaining = snap.bytes_total - snap.bytes_done
    more = "+" if snap.listing else ""  # totals of what is listed so far
    if snap.listing:
        eta = "still listing"
    else:
        eta = "ETA " + (human_seconds(remaining / rate) if rate > 0 else "?")
    return (
        f"{label}: {snap.files_done}/{snap.files_total}{more} files, "
        f"{human_bytes(snap.bytes_done)}/{human_bytes(snap.bytes_total)}{more} ({pct:.0f}%), "
        f"{rate / MIB:.1f} MiB/s, {eta}"
    )


class Reporter:
    """Shows progress from a background thread until stopped (context manager)."""

    def __init__(
        self, progress: Progress, label: str, interval: float, tty: bool | None = None
    ) -> None:
        self._progress = progress
        self._label = label
        self._interval = interval
        self._tty = sys.stderr.isatty() if tty is None else tty
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="progress", daemon=True)

    def __enter__(self) -> Reporter:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        if self._tty:
            self._run_bar()
            return
        last_bytes, last_time = 0, time.monotonic()
        while not self._stop.wait(self._interval):
            snap = self._progress.snapshot()
            now = time.monotonic()
            rate = (snap.bytes_fetched - last_bytes) / max(now - last_time, 1e-6)
            last_bytes, last_time = snap.bytes_fetched, now
            log.info(
                format_line(self._label, snap, rate),
                extra={"progress": snap.__dict__ | {"rate_bps": rate}},
            )

    def _run_bar(self) -> None:
        """Redraw one status line in place (carriage return), then end it with a newline."""
        started = time.monotonic()
        while True:
            stopped = self._stop.wait(0.5)
            snap = self._progress.snapshot()
            rate = snap.bytes_fetched / max(time.monotonic() - started, 1e-6)
            width = shutil.get_terminal_size((100, 24)).columns
            line = format_line(self._label, snap, rate)[: max(width - 1, 20)]
            sys.stderr.write(f"\r{line:<{max(width - 1, 20)}}" + ("\n" if stopped else ""))
            sys.stderr.flush()
            if stopped:
                return

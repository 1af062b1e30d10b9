"""Append-only records that make interrupted work resumable.

* :class:`RangeJournal` sits beside a ``.part`` file and records which byte intervals are on
  disk, so a rerun after a kill fetches only the holes.
* :class:`CommitLog` sits at the destination root and records each file committed by a run that
  has not yet written its manifest, so a rerun keeps them.

Both are plain appends of short lines: a torn last line after a crash is simply ignored.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from initializers.fsutil import boot_id
from initializers.manifest import FileRecord, json_string

Interval = tuple[int, int]
READ_BYTES = 1 << 20  # a commit log is read about this many bytes of lines at a time


def merge(intervals: list[Interval]) -> list[Interval]:
    merged: list[Interval] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        elif start < end:
            merged.append((start, end))
    return merged


def holes(done: list[Interval], size: int) -> list[Interval]:
    """The parts of ``[0, size)`` not covered by ``done``."""
    missing, cursor = [], 0
    for start, end in merge(done):
        if start > cursor:
            missing.append((cursor, start))
        cursor = max(cursor, end)
    if cursor < size:
        missing.append((cursor, size))
    return missing


class RangeJournal:
    """Which intervals of one ``.part`` file hold verified-length bytes of one version."""

    def __init__(self, path: Path, identity: dict[str, object]) -> None:
        self.path = path
        self._identity = identity
        self._fd: int | None = None
        # Several workers record one file's ranges, and whichever holder gets there first closes
        # the journal (the worker that finished the file, or the commit that removes it): the
        # descriptor is given up under this lock, so it is closed once and never written after.
        # A closed number is soon another file's: a second close hit one in a benchmark run
        # ("Bad file descriptor", fixed by ordering in c4abcad; this makes the order not matter).
        self._lock = threading.Lock()

    def load(self) -> list[Interval]:
        """Intervals recorded for the same identity; empty when absent or for another version."""
        try:
            lines = self.path.read_text().splitlines()
        except (OSError, UnicodeDecodeError):
            return []
        try:
            if not lines or json.loads(lines[0]) != self._identity:
                return []
        except ValueError:
            return []
        done = []
        for line in lines[1:]:
            fields = line.split()
            if len(fields) == 2 and all(f.isdigit() for f in fields):
                done.append((int(fields[0]), int(fields[1])))
        return merge(done)

    def open(self, fresh: bool) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW
        if fresh:
            flags |= os.O_TRUNC
        self._fd = os.open(self.path, flags, 0o644)
        if fresh:
            os.write(self._fd, (json.dumps(self._identity) + "\n").encode())

    def record(self, start: int, end: int) -> None:
        with self._lock:
            if self._fd is not None and end > start:
                os.write(self._fd, f"{start} {end}\n".encode())

    def close(self) -> None:
        with self._lock:
            fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def remove(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)


class CommitLog:
    """Files committed by a run whose manifest is not written yet."""

    NAME = ".initializer-commits.jsonl"

    def __init__(self, dest: Path, name: str = NAME, *, durable: bool = True) -> None:
        self.path = dest / name
        self.durable = durable  # whether the files this run records were synced first
        self._fd: int | None = None
        self._lock = threading.Lock()

    def load(self) -> dict[str, FileRecord]:
        return dict(self.records())

    def records(self) -> Iterator[tuple[str, FileRecord]]:
        """What the log holds, a line at a time (a torn or foreign line is skipped)."""
        for path, record, _ in self.records_with_trust(""):
            yield path, record

    def records_with_trust(self, current_boot: str) -> Iterator[tuple[str, FileRecord, bool]]:
        """Each record, and whether its file's size and mtime still vouch for its bytes: each
        run's lines follow a line saying which boot wrote them and whether it synced first
        (lines before any such line come from a release that always synced)."""
        try:
            stream = open(self.path, "rb")  # noqa: SIM115 - closed below, after the last line
        except OSError:
            return
        trusted = True
        with stream:
            while lines := stream.readlines(READ_BYTES):
                for entry in _parsed(lines):
                    try:
                        if "boot_id" in entry:
                            trusted = entry.get("durable") is not False or (
                                bool(entry["boot_id"]) and entry["boot_id"] == current_boot
                            )
                            continue
                        path = entry.pop("path")  # before FileRecord(**entry): no "path" there
                        yield path, FileRecord(**entry), trusted
                    except (TypeError, KeyError, AttributeError):
                        continue

    def append_all(self, records: dict[str, FileRecord]) -> None:
        """Record ``records`` with one write (a line each)."""
        line = "".join(
            f'{{"path": {json_string(path)}, {record.to_json()[1:]}\n'
            for path, record in records.items()
        ).encode()
        with self._lock:
            if self._fd is None:
                flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW
                self._fd = os.open(self.path, flags, 0o644)
                head = {"boot_id": boot_id(), "durable": self.durable}
                line = (json.dumps(head) + "\n").encode() + line
            os.write(self._fd, line)

    def remove(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self.path.unlink(missing_ok=True)


def _parsed(lines: list[bytes]) -> list[Any]:
    """The JSON value of each of ``lines``: read as one array, one C call for them all (a line
    at a time cost a million-file log ~2 s more), or, when that fails or the values do not
    match the lines one to one, a line at a time, a torn or foreign line left out."""
    try:
        values = json.loads(b"[" + b",".join(lines) + b"]")
    except ValueError:
        values = None
    if isinstance(values, list) and len(values) == len(lines):
        return values
    parsed = []
    for line in lines:
        with contextlib.suppress(ValueError):
            parsed.append(json.loads(line))
    return parsed

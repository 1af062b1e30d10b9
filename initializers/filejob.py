"""One file's life in a run: its ``.part``, its journal, the ranges still to fetch, its digest.

The engine fans these out and commits them; a FileJob knows what is on disk for its file and
what is left, and opens nothing until a worker needs it (a dataset of many files must not hold
a descriptor per file).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from itertools import zip_longest
from pathlib import Path

from initializers import checksum as checksums
from initializers.crcspans import CrcSpans, combines
from initializers.destination import storage_error
from initializers.fsutil import journal_path, part_path
from initializers.journal import RangeJournal, holes, merge
from initializers.sources.base import Checksum, RemoteFile, Source

log = logging.getLogger(__name__)

MIB = 1 << 20
RANGE_SIZE = 32 * MIB  # bytes per request for large files
CHECKPOINT = 4 * MIB  # journal granularity: at most this much is refetched per range on resume


class FileJob:
    """One file being fetched: its .part, its journal, and the ranges still to do.

    Slotted, and its names made only when first needed: a run holds one per file to fetch
    until it ends (~500 bytes each with a ``__dict__``, ~300 without, on 100,000 files)."""

    __slots__ = (
        "_dest",
        "_expected",
        "_expected_known",
        "_final",
        "_journal",
        "_lock",
        "_part",
        "_pending",
        "_resume",
        "_room",
        "fd",
        "headers",
        "kept",
        "present",
        "ranges",
        "refetched",
        "remote",
        "resumable",
        "spans",
        "streamed_digest",
    )

    def __init__(
        self, remote: RemoteFile, dest: Path, room: Callable[[Path], None] | None = None
    ) -> None:
        self.remote = remote
        self._dest = dest
        # Readies the folder and refuses a symlink at ``final``: run by the worker that takes the
        # file, before its first request (or its first open, for an empty file), so thousands of
        # files cost the run's start nothing (the start waited ~0.3 s for them on the
        # benchmark's dataset) and the checks overlap the transfers.
        self._room = room
        self.resumable = remote.size > CHECKPOINT and remote.ranged
        self.fd: int | None = None
        self.headers: Mapping[str, str] | None = None
        self.ranges: list[tuple[int, int]] = []
        self.present = 0  # bytes kept from an interrupted run
        self.refetched = False  # set after one checksum mismatch; a second one is final
        self._lock = threading.Lock()
        self._pending = 0
        self._resume = False
        self._expected: Checksum | None = None
        self._expected_known = False
        self.streamed_digest: str | None = None  # digest computed while streaming, if any
        self.kept: tuple[tuple[int, int], ...] = ()  # spans an interrupted run left on disk
        self.spans: checksums.SpanDigest | CrcSpans | None = None  # of a file fetched in ranges
        self._final: Path | None = None
        self._part: Path | None = None
        self._journal: RangeJournal | None = None

    # Its names, made when first needed: by the worker that takes the file, not by the
    # planning before the first request. For the benchmark's 2,002 files that planning took
    # 23-30 ms of CPU while it made ``final``, 13-16 ms since; making the names beside
    # ``final`` here had saved ~15 ms before.
    @property
    def final(self) -> Path:
        if self._final is None:
            self._final = self._dest / self.remote.path
        return self._final

    @property
    def part(self) -> Path:
        if self._part is None:
            self._part = part_path(self.final)
        return self._part

    @property
    def journal(self) -> RangeJournal:
        """One per file: its descriptor is shared by the file's workers."""
        if self._journal is None:
            with self._lock:
                return self._journal_locked()
        return self._journal

    def _journal_locked(self) -> RangeJournal:
        if self._journal is None:
            identity = {"size": self.remote.size, "version": self.remote.version}
            self._journal = RangeJournal(journal_path(self.final), identity)
        return self._journal

    def plan(self) -> None:
        """Work out which ranges remain, keeping bytes an interrupted run left (opens nothing:
        a dataset of many files must not hold a descriptor per file)."""
        if not self.resumable:  # the whole file, again (no journal to read: most files)
            size = self.remote.size
            self._resume, self.kept, self.spans, self.present = False, (), None, 0
            self.ranges = [(0, size)] if size else []
            self._pending = len(self.ranges)
            return
        self._resume = self._part_size() == self.remote.size
        done = self.journal.load() if self._resume else []
        self._resume = bool(done)
        missing = holes(done, self.remote.size)
        size = self.remote.size
        self.kept = tuple((s, min(e, size)) for s, e in merge(done) if s < size)
        self.spans = None
        self.present = self.remote.size - sum(end - start for start, end in missing)
        split = split_range if self.remote.ranged else lambda start, end: [(start, end)]
        self.ranges = [r for start, end in missing for r in split(start, end)]
        self._pending = len(self.ranges)

    def make_room(self) -> None:
        """Ready the folder and check the final name (once)."""
        if self._room is not None:
            try:
                self._room(self.final)
            except OSError as exc:
                raise storage_error(exc, self.final) from None
            self._room = None

    def open(self) -> int:
        """The .part's descriptor, opened by whichever worker needs it first."""
        with self._lock:
            if self.fd is None:
                flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW
                self.make_room()
                try:
                    self.fd = os.open(self.part, flags | (0 if self._resume else os.O_TRUNC), 0o644)
                    if self.resumable:  # its full size is what lets a rerun trust the journal
                        os.ftruncate(self.fd, self.remote.size)
                        self._journal_locked().open(fresh=not self._resume)
                except OSError as exc:
                    raise storage_error(exc, self.final) from None
            return self.fd

    def _part_size(self) -> int:
        try:
            return os.stat(self.part, follow_symlinks=False).st_size
        except OSError:
            return -1

    def range_finished(self) -> bool:
        """Count one range done; True for the caller that finished the last one."""
        with self._lock:
            self._pending -= 1
            return self._pending == 0

    def expected_checksum(self, source: Source) -> Checksum | None:
        """The digest to verify this file against (asked of the source once per fetch)."""
        if not self._expected_known:
            with self._lock:  # once: the headers are dropped then (a file's ranges ask at once)
                if not self._expected_known:
                    self._expected = self._checksum_from(source)
                    self._expected_known = True
                    self.headers = None  # a run of many files must not keep them all
        return self._expected

    def _checksum_from(self, source: Source) -> Checksum | None:
        expected = source.checksum_for(self.remote, self.headers or {})
        if expected and not checksums.is_supported(expected.algorithm):
            log.debug("%s: cannot verify %s here; size checked only", self.remote.path, expected)
            return None
        return expected

    def correct_checksum(self, expected: Checksum) -> None:
        """Verify against ``expected`` from now on: another digest of the same object, which the
        source offered after the first did not match (``Source.other_checksums``)."""
        self._expected, self._expected_known = expected, True

    def note_headers(self, headers: Mapping[str, str]) -> None:
        """Keep the first response's headers (case-insensitive, as the transport gives them)
        until the checksum to verify against is known."""
        if self.headers is None and not self._expected_known:
            self.headers = headers

    def span_digest(self, source: Source) -> checksums.SpanDigest | CrcSpans | None:
        """The digest of this file's ranges (a CRC put together from theirs, or a hash read
        in order: :class:`CrcSpans`, :class:`SpanDigest`), if there is a checksum;
        the first call hands it the spans an interrupted run left on disk."""
        expected = self.expected_checksum(source)
        if expected is None:
            return None
        with self._lock:
            first = self.spans is None
            if first:
                digest = CrcSpans if combines(expected.algorithm) else checksums.SpanDigest
                self.spans = digest(expected.algorithm, self.remote.size, expected.parts)
            spans = self.spans
        if first and self.kept:
            fd = self.open()
            for kept_start, kept_end in self.kept:
                spans.span_done(fd, kept_start, kept_end)
        return spans

    def discard(self) -> None:
        """Forget the bytes on disk (after a checksum mismatch)."""
        self.streamed_digest = None
        self.spans = None
        self.close()
        self.journal.remove()
        self.part.unlink(missing_ok=True)

    def close_journal(self) -> None:
        """Close the journal if this run opened one: only a resumable file has one, and
        making its name cost a small file's loop thread more than the close."""
        if self._journal is not None:
            self._journal.close()

    def remove_journal(self) -> None:
        """Close and delete the journal; a small file's, which this run never made, is only
        unlinked (one an interrupted run left when the file was larger)."""
        if self._journal is not None or self.resumable:
            self.journal.remove()
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(journal_path(self.final))

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        self.close_journal()


def split_range(start: int, end: int) -> list[tuple[int, int]]:
    if end - start <= RANGE_SIZE + RANGE_SIZE // 2:
        return [(start, end)]
    count = -(-(end - start) // RANGE_SIZE)
    step = -(-(end - start) // count)
    return [(s, min(s + step, end)) for s in range(start, end, step)]


def interleaved(jobs: list[FileJob], group: int) -> Iterator[tuple[FileJob, tuple[int, int]]]:
    """Ranges taken in turn from ``group`` files at a time: each file's spans then land in
    order, so its digest advances during the transfer instead of all at its end, while only a
    bounded number of files are open at once."""
    for first in range(0, len(jobs), group):
        batch = jobs[first : first + group]
        for ranges in zip_longest(*(job.ranges for job in batch)):
            yield from ((job, r) for job, r in zip(batch, ranges, strict=True) if r is not None)

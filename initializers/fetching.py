"""Fetching one file: its ranges into the ``.part``, its verification, its hand-off to commit.

The engine plans the jobs and fans them out; a :class:`FileFetcher` is what every worker of one
process runs on the job it takes: ranged requests resumed where the last attempt stopped,
digests computed where they are cheapest, and a verified file queued for its batch's durable
rename (:mod:`initializers.commits`). A file whose checksum does not match is fetched once more;
a second mismatch ends the run.
"""

from __future__ import annotations

import logging
import threading
from functools import partial

from initializers import checksum as checksums
from initializers.commits import GroupCommit, Verified
from initializers.destination import storage_error
from initializers.errors import IntegrityError, TransientError
from initializers.filejob import CHECKPOINT, FileJob
from initializers.fsutil import start_writeback, write_all
from initializers.progress import Progress
from initializers.retry import RetryPolicy
from initializers.sources.base import Checksum, Source

log = logging.getLogger(__name__)


class Cancelled(Exception):
    """Raised inside workers once the run is stopping (another failure, or SIGTERM)."""


class FileFetcher:
    """Fetches, verifies and queues for commit the files one process's workers take."""

    def __init__(
        self,
        source: Source,
        retry: RetryPolicy,
        stop: threading.Event,
        progress: Progress,
        group: GroupCommit,
    ) -> None:
        self.source = source
        self.retry = retry
        self.stop = stop
        self.progress = progress
        self.group = group

    def fetch_range(
        self, job: FileJob, start: int, end: int, failed: TransientError | None = None
    ) -> None:
        """Fetch ``[start, end)`` into the .part, resuming within the range on retries;
        ``failed``: a first attempt already made (the native loop's), counted in the budget.

        The retry budget counts attempts since the last one that got the range further
        (:data:`~initializers.retry.PROGRESS_BYTES`): a link that breaks every few MiB still
        finishes, a dead one ends as before.

        A file fetched whole in one range is digested as it streams, so committing it needs no
        read-back; a large file's writeback is started every checkpoint, so the fsync before its
        commit finds little left to write instead of all of it at the end.
        """
        position = start
        checkpoint = start
        digest: checksums.Digest | None = None
        streaming = start == 0 and end == job.remote.size

        def attempt() -> None:
            if self.stop.is_set():
                raise Cancelled
            try:
                transfer()
            except Exception:
                if self.stop.is_set():  # the stop cut this read short (transport.interrupt_reads)
                    raise Cancelled from None
                raise

        def transfer() -> None:
            nonlocal position, checkpoint, digest
            if position > start and not job.remote.ranged:  # no resuming: again from the start
                self.progress.add_bytes(start - position)
                position, digest = start, None
            with self.source.open_range(job.remote, position, end) as reader:
                job.note_headers(reader.headers)
                if streaming and digest is None and position == 0:
                    expected = job.expected_checksum(self.source)
                    if expected:
                        digest = checksums.new_digest(
                            expected.algorithm, job.remote.size, expected.parts
                        )
                spans = None if streaming else job.span_digest(self.source)
                copy_into = getattr(reader, "copy_into", None)
                if copy_into is not None and digest is None and spans is None:
                    # Nothing to digest: the kernel copies (copy_file_range, a reflink where
                    # the filesystem shares blocks), in steps that keep stops and checkpoints.
                    for count in copy_into(job.open(), position):
                        advanced(count)
                    return
                for chunk in reader.chunks():
                    self._write(job, chunk, position)
                    if digest is not None:
                        digest.update(chunk)
                    elif spans is not None:
                        spans.offer(chunk, position)
                    advanced(len(chunk))

        def advanced(count: int) -> None:
            """``count`` more bytes are in the .part: progress, and a checkpoint when due."""
            nonlocal position, checkpoint
            if self.stop.is_set():
                raise Cancelled
            position += count
            self.progress.add_bytes(count)
            if job.resumable and position - checkpoint >= CHECKPOINT:
                start_writeback(job.open(), checkpoint, position - checkpoint)
                job.journal.record(start, position)
                checkpoint = position

        try:
            self.retry.call(attempt, job.remote.path, progress=lambda: position, failed=failed)
        except OSError as exc:
            raise storage_error(exc, job.final) from None
        finally:
            if job.resumable and position > checkpoint:
                job.journal.record(start, position)
        if digest is not None:
            job.streamed_digest = digest.finish()
        elif not streaming and (spans := job.span_digest(self.source)) is not None:
            try:
                spans.span_done(job.open(), start, end)
            except OSError as exc:
                raise storage_error(exc, job.final) from None

    def _write(self, job: FileJob, view: memoryview, offset: int) -> None:
        fd = job.open()
        try:
            write_all(fd, view, offset)
        except OSError as exc:
            raise storage_error(exc, job.final) from None

    def commit(self, job: FileJob) -> None:
        """Verify the finished .part, then queue it for its batch's durable rename."""
        expected = job.expected_checksum(self.source)
        if expected:
            if job.streamed_digest:
                actual = job.streamed_digest
            elif job.spans is not None:
                actual = job.spans.finish(job.open())
            else:
                actual = self._digest_on_disk(job, expected)
            if actual != expected.value:
                for other in self.source.other_checksums(job.remote, expected):
                    if self._digest_on_disk(job, other) == other.value:
                        log.info(
                            "%s: verified by %s (the source's %s did not match)",
                            job.remote.path,
                            other,
                            expected,
                        )
                        job.correct_checksum(other)
                        expected, actual = other, other.value
                        break
            if actual != expected.value:
                return self._refetch_after_mismatch(job, str(expected), actual)
        self._queue(job, expected)

    def _digest_on_disk(self, job: FileJob, expected: Checksum) -> str:
        fd = job.open()
        return checksums.digest_file(fd, job.remote.size, expected.algorithm, expected.parts)

    def commit_streamed(self, job: FileJob) -> bool:
        """Queue a file digested as it streamed when that digest matches (or there is no
        checksum), without blocking: True. False leaves it to :meth:`commit` on a worker,
        where a mismatch fetches it again."""
        expected = job.expected_checksum(self.source)
        if expected and job.streamed_digest != expected.value:
            return False
        self._queue(job, expected)
        return True

    def _queue(self, job: FileJob, expected: Checksum | None) -> None:
        verified = Verified(
            path=job.remote.path,
            part=job.part,
            final=job.final,
            size=job.remote.size,
            checksum=str(expected) if expected else None,
            version=job.remote.version,
            on_commit=partial(self._committed, job),
        )
        try:
            # Closed before the group sees the file: the group's thread may commit it at once
            # and remove the journal (closing it) while this one would still close it too. That
            # double close hit a descriptor reused by another file (EBADF in its next write: one
            # Hub model run of 25 in a complete make bench at 828533e).
            job.close_journal()
            self.group.add(job.open(), verified)
            job.close()
        except OSError as exc:
            raise storage_error(exc, job.final) from None

    def _committed(self, job: FileJob) -> None:
        """After ``job``'s rename: its journal has nothing left to say."""
        job.remove_journal()
        self.progress.file_done()

    def _refetch_after_mismatch(self, job: FileJob, expected: str, actual: str) -> None:
        if job.refetched:
            job.discard()
            raise IntegrityError(
                f"{job.remote.path}: checksum mismatch twice (expected {expected}, got "
                f"{actual}); the source object may be corrupt — check it, then rerun"
            )
        log.warning(
            "%s: checksum mismatch (expected %s); fetching it again", job.remote.path, expected
        )
        job.discard()
        job.refetched = True
        job.plan()
        for start, end in job.ranges:
            self.fetch_range(job, start, end)
        self.commit(job)

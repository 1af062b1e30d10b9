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
        """
        transfer = _RangeTransfer(self, job, start, end)
        try:
            self.retry.call(
                transfer.attempt, job.remote.path, progress=lambda: transfer.position, failed=failed
            )
        except OSError as exc:
            raise storage_error(exc, job.final) from None
        finally:
            transfer.record_checkpoint()
        transfer.finish()

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


class _RangeTransfer:
    """One range of one file on its way into the ``.part``, across retries: where it got to,
    the last checkpoint the journal holds, and the digest of a file fetched whole in one range
    (digested as it streams, so committing it needs no read-back). A large file's writeback is
    started every checkpoint, so a durable commit finds little left to write."""

    def __init__(self, fetcher: FileFetcher, job: FileJob, start: int, end: int) -> None:
        self.fetcher, self.job, self.start, self.end = fetcher, job, start, end
        self.position = self.checkpoint = start
        self.digest: checksums.Digest | None = None
        self.streaming = start == 0 and end == job.remote.size

    def attempt(self) -> None:
        stop = self.fetcher.stop
        if stop.is_set():
            raise Cancelled
        try:
            self._transfer()
        except Exception:
            if stop.is_set():  # the stop cut this read short (transport.interrupt_reads)
                raise Cancelled from None
            raise

    def _transfer(self) -> None:
        job, source = self.job, self.fetcher.source
        if self.position > self.start and not job.remote.ranged:  # no resuming: from the start
            self.fetcher.progress.add_bytes(self.start - self.position)
            self.position, self.digest = self.start, None
        with source.open_range(job.remote, self.position, self.end) as reader:
            job.note_headers(reader.headers)
            if self.streaming and self.digest is None and self.position == 0:
                expected = job.expected_checksum(source)
                if expected:
                    self.digest = checksums.new_digest(
                        expected.algorithm, job.remote.size, expected.parts
                    )
            spans = None if self.streaming else job.span_digest(source)
            copy_into = getattr(reader, "copy_into", None)
            if copy_into is not None and self.digest is None and spans is None:
                # Nothing to digest: the kernel copies (copy_file_range, a reflink where the
                # filesystem shares blocks), in steps that keep stops and checkpoints.
                for count in copy_into(job.open(), self.position):
                    self._advanced(count)
                return
            for chunk in reader.chunks():
                self.fetcher._write(job, chunk, self.position)
                if self.digest is not None:
                    self.digest.update(chunk)
                elif spans is not None:
                    spans.offer(chunk, self.position)
                self._advanced(len(chunk))

    def _advanced(self, count: int) -> None:
        """``count`` more bytes are in the .part: progress, and a checkpoint when due."""
        if self.fetcher.stop.is_set():
            raise Cancelled
        self.position += count
        self.fetcher.progress.add_bytes(count)
        if self.job.resumable and self.position - self.checkpoint >= CHECKPOINT:
            if self.fetcher.group.durable:  # its commit's fsync then finds little left to do
                start_writeback(self.job.open(), self.checkpoint, self.position - self.checkpoint)
            self.job.journal.record(self.start, self.position)
            self.checkpoint = self.position

    def record_checkpoint(self) -> None:
        """What got further than the last checkpoint goes into the journal (for the rerun)."""
        if self.job.resumable and self.position > self.checkpoint:
            self.job.journal.record(self.start, self.position)

    def finish(self) -> None:
        """The range is all there: keep the streamed digest, or close this span's."""
        job = self.job
        if self.digest is not None:
            job.streamed_digest = self.digest.finish()
        elif not self.streaming and (spans := job.span_digest(self.fetcher.source)) is not None:
            try:
                spans.span_done(job.open(), self.start, self.end)
            except OSError as exc:
                raise storage_error(exc, job.final) from None

"""Scheduling: which request runs where, so many files and large ones share the workers well.

Small files (one range) may be shared with forked worker processes (:mod:`initializers.processes`);
in each process, large ranges run on ``workers`` threads of their own, small ones on more (they
mostly wait for their first byte, :data:`~initializers.inflight.SMALL_IN_FLIGHT`), and where the
source can, small files are fetched whole on the native event loop
(:mod:`initializers.wholefiles`), the threads then only verifying and committing them. One file's
life is :mod:`initializers.fetching`'s; this module only decides where and when, and turns the
first failure into a stop of everything else.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from initializers import native, processes
from initializers.commits import GroupCommit
from initializers.destination import storage_error
from initializers.errors import STOPPED, InitializerError, Interrupted, TransientError
from initializers.fetching import Cancelled, FileFetcher
from initializers.filejob import FileJob, interleaved
from initializers.fsutil import fsync_dir
from initializers.heap import kept_until_the_end
from initializers.inflight import SMALL_BODY, SMALL_IN_FLIGHT, loop_in_flight
from initializers.journal import CommitLog
from initializers.manifest import FileRecord
from initializers.progress import Progress, Reporter
from initializers.retry import RetryPolicy
from initializers.sources.base import Source
from initializers.wholefiles import fetch_whole_files

log = logging.getLogger(__name__)


class Work(Protocol):
    """What the scheduler runs: jobs in windows, dealt out between processes; ``begin`` is
    called in the parent once they are forked (a plan still being made goes on from there)."""

    def small_files(self) -> int: ...

    def begin(self) -> None: ...

    def windows(self, share: int, count: int) -> Iterator[list[FileJob]]: ...


class Scheduler:
    """Runs a destination's jobs with ``workers`` requests in flight; returns what it committed."""

    def __init__(
        self,
        source: Source,
        dest: Path,
        commits: CommitLog,
        *,
        workers: int,
        retry: RetryPolicy,
        stop: threading.Event,
        label: str,
        progress_interval: float,
    ) -> None:
        self.source = source
        self.dest = dest
        self.commits = commits
        self.workers = workers
        self.retry = retry
        self.stop = stop
        self.label = label
        self.progress_interval = progress_interval

    def fetch_all(self, work: Work, progress: Progress) -> int:
        """Fetch and commit every job of ``work``, sharing the small files with forked
        processes; how many files were committed (their records are in the commit log)."""
        small = work.small_files()  # a count over the whole plan: asked once
        count = processes.process_count(small, self.workers)
        if count == 1:
            work.begin()
            with Reporter(progress, self.label, self.progress_interval):
                return self.run_windows(work.windows(0, 1), self.workers, progress)
        each = max(1, self.workers // count)
        self.source.close()  # a pooled connection must never be shared with a child
        # Forked once, before any other thread of this process starts (the reporter, the
        # workers, a native client's runtime): each process then runs its share's windows.
        children = [
            processes.fork(partial(self._share, work, i, count, each), self.stop)
            for i in range(1, count)
        ]
        work.begin()  # the parent's own threads start only now
        shared = "the small" if small == processes.UNCOUNTED else str(small)
        log.debug("%s: %d worker processes share %s files", self.label, count, shared)
        relay = threading.Thread(
            target=processes.gather,
            args=(children, self.stop, progress.add_counts),
            name="children",
        )
        own: BaseException | None = None
        committed = 0
        with Reporter(progress, self.label, self.progress_interval):
            relay.start()
            try:
                mine = work.windows(0, count)
                committed = self.run_windows(
                    mine, max(1, self.workers - each * (count - 1)), progress
                )
            except InitializerError as exc:
                own = exc
                self.stop.set()  # the children stop too
            except BaseException:
                self.stop.set()
                raise
            finally:
                relay.join()
        failures = [e for e in (own, *(child.error for child in children)) if e is not None]
        if failures:  # the real failure first, the Interrupted it caused elsewhere after it
            raise next((e for e in failures if not isinstance(e, Interrupted)), failures[0])
        return committed + sum(int((child.result or {}).get("files", 0)) for child in children)

    def _share(
        self, work: Work, share: int, count: int, workers: int, progress: Any
    ) -> dict[str, int]:
        """A forked child's whole life: its share's windows; how many files it committed."""
        return {"files": self.run_windows(work.windows(share, count), workers, progress)}

    def run_windows(self, windows: Iterator[list[FileJob]], workers: int, progress: Any) -> int:
        """Run each window of jobs in turn in this process; how many files were committed.
        A window's objects are dropped before the next one's are made; the threads stay."""
        committed = 0
        with _Pools(workers, self.source.fetches_whole) as pools:
            while (jobs := next(windows, None)) is not None:
                with kept_until_the_end():
                    records = self.run_jobs(jobs, pools, progress)
                del jobs
                committed += len(records)
                if self.commits.durable:
                    for folder in {path.rpartition("/")[0] for path in records}:  # not Paths
                        fsync_dir(self.dest / folder)
        return committed

    def run_jobs(
        self, jobs: list[FileJob], pools: _Pools, progress: Progress
    ) -> dict[str, FileRecord]:
        """Run ``jobs`` on this process's ``pools`` (a forked child's ``progress`` is sent to
        the parent); their verified files, committed."""
        group = GroupCommit(self.dest, self.commits)  # one per run of jobs (per process)
        fetcher = FileFetcher(self.source, self.retry, self.stop, progress, group)
        batch = _Batch(self, fetcher, jobs, pools, progress)
        try:
            errors = batch.run()
        except BaseException:
            group.settle()
            raise
        finally:
            for job in jobs:
                job.close()
        real = [e for e in errors if not isinstance(e, Cancelled)]
        if real:
            # Files verified before the failure are kept for the rerun (a stop skips this: it
            # must end within seconds, and a kill would lose no more than the batch).
            with contextlib.suppress(OSError):
                group.flush()
            raise real[0]
        if errors or self.stop.is_set():
            group.settle()
            raise Interrupted(STOPPED)
        try:
            group.flush()
        except OSError as exc:
            raise storage_error(exc, self.dest) from None
        return group.records


class _Pools:
    """A process's threads for the whole run, window after window (made afresh for each window,
    a million small files started some 15,000 threads). Large ranges run on ``workers`` threads
    of their own: each keeps its read-back buffers (RSS on the Hub model: 189 MiB when they ran
    on the small files' threads too, not 132). Small files' requests wait in threads unless the
    native loop has them: then the small threads only verify and commit, one a worker."""

    def __init__(self, workers: int, loop_fetches: bool) -> None:
        self.workers = workers
        self.large = ThreadPoolExecutor(workers, thread_name_prefix="fetch")
        small = workers if loop_fetches else workers * SMALL_IN_FLIGHT
        self.small = ThreadPoolExecutor(small, thread_name_prefix="small")

    def __enter__(self) -> _Pools:
        return self

    def __exit__(self, *exc: object) -> None:
        self.large.shutdown()
        self.small.shutdown()


class _Batch:
    """One process's run of jobs: two thread pools and, where the source can, the native loop."""

    def __init__(
        self,
        scheduler: Scheduler,
        fetcher: FileFetcher,
        jobs: list[FileJob],
        pools: _Pools,
        progress: Progress,
    ) -> None:
        self.source = scheduler.source
        self.stop = scheduler.stop
        self.fetcher = fetcher
        self.jobs = jobs
        self.workers = pools.workers
        self.large, self.small = pools.large, pools.small
        self.progress = progress
        self.futures: list[Future[None]] = []
        # Small files fetched whole on the native loop, where the source can (wholefiles.py).
        self.whole = [
            job
            for job in jobs
            if self.source.fetches_whole
            and job.remote.size <= SMALL_BODY
            and job.ranges == [(0, job.remote.size)]
        ]

    def run(self) -> list[BaseException]:
        """Submit every request, wait for all of them; the failures met (none: all went well).
        Nothing of the window still runs when this returns: its jobs are closed next."""
        try:
            self._submit_threads()
            if self.whole:
                native.run_on_loop(self._fetch_whole, self.stop)
            return self._wait()
        finally:
            for future in self.futures:
                future.cancel()
            wait(self.futures)
            # The futures' callbacks point back here: kept, the window's jobs and futures
            # would wait for the cycle collector, windows of them at a time.
            self.futures = []

    def _submit_threads(self) -> None:
        for job in self.jobs:
            if not job.ranges:
                self._submit(self.small, self.fetcher.commit, job)
        picked = {id(job) for job in self.whole}
        rest = [job for job in self.jobs if id(job) not in picked]
        for job, (start, end) in interleaved(rest, max(1, self.workers // 2)):
            pool = self.small if end - start <= SMALL_BODY else self.large
            self._submit(pool, self._run_range, job, start, end)

    def _fetch_whole(self) -> Any:
        return fetch_whole_files(
            self.source,
            self.whole,
            in_flight=loop_in_flight(self.workers, [job.remote.size for job in self.whole]),
            stop=self.stop,
            progress=self.progress,
            fetched=self._commit_streamed,
            failed=lambda job, exc: self._submit(self.small, self._after_failure, job, exc),
        )

    def _wait(self) -> list[BaseException]:
        while pending := [future for future in self.futures if not future.done()]:
            done, _ = wait(pending, return_when=FIRST_EXCEPTION)
            if self.stop.is_set() or any(not f.cancelled() and f.exception() for f in done):
                self.stop.set()
                for future in pending:
                    future.cancel()
        found = (f.exception() for f in self.futures if not f.cancelled())
        return [error for error in found if error is not None]

    def _submit(
        self, pool: ThreadPoolExecutor, task: Callable[..., None], *args: Any
    ) -> Future[None]:
        future = pool.submit(task, *args)
        future.add_done_callback(self._stop_on_failure)
        self.futures.append(future)  # atomic: the loop thread appends too
        return future

    def _stop_on_failure(self, future: Future[None]) -> None:
        if not future.cancelled() and future.exception() is not None:
            self.stop.set()

    def _run_range(
        self, job: FileJob, start: int, end: int, failed: TransientError | None = None
    ) -> None:
        job.make_room()  # before the request: what is planted after it is replaced
        self.fetcher.fetch_range(job, start, end, failed)
        if job.range_finished():
            self.fetcher.commit(job)

    def _after_failure(self, job: FileJob, failure: Exception) -> None:
        """A small file the native loop could not fetch, the workers' way: a final failure ends
        the run as it would have here, a transient one counts in the retry budget."""
        if isinstance(failure, InitializerError):
            raise failure
        transient = failure if isinstance(failure, TransientError) else None
        self._run_range(job, 0, job.remote.size, transient)

    def _commit_streamed(self, job: FileJob) -> Future[None] | None:
        """On the loop: queued for commit at once, unless a worker must see to it (its digest
        did not match: it is fetched again)."""
        if self.fetcher.commit_streamed(job):
            return None
        return self._submit(self.small, self.fetcher.commit, job)

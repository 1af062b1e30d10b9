"""The transfer engine: one implementation of fetching, for every source and both assets.

Given the files a source lists, it decides what is already in place (planning), fans the rest
out over worker threads and forked processes in parallel byte ranges (bounded memory: one 1 MiB
chunk in flight per worker), and writes the manifest last. The other roles live beside it: one
file's fetch, verification and hand-off to commit in :mod:`initializers.fetching`, its state on
disk in :mod:`initializers.filejob`, batched durable renames in :mod:`initializers.commits`, the
destination's lock and write errors in :mod:`initializers.destination`, worker processes in
:mod:`initializers.processes`.

On disk, under the destination::

    NAME                        committed files (final names only ever hold complete files)
    .NAME.part                  bytes being fetched, at their final offsets
    .NAME.part.journal          which intervals of the .part are done (large files only)
    .initializer-commits.jsonl  files committed by a run that has not finished yet
    .initializer-manifest.json  written last: the folder is complete
    .initializer.lock           held while a run works on the folder
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from initializers import native, processes
from initializers.commits import GroupCommit
from initializers.destination import FileLock, destination_lock, inside, storage_error
from initializers.errors import InitializerError, Interrupted, LocalStorageError, TransientError
from initializers.fetching import Cancelled, FileFetcher
from initializers.filejob import FileJob, interleaved
from initializers.fsutil import fsync_dir, make_room_for
from initializers.heap import collection_paused, kept_until_the_end
from initializers.inflight import (
    LOOP_PER_WORKER,
    MAX_BODIES_IN_FLIGHT,
    MIB,
    SMALL_BODY,
    SMALL_IN_FLIGHT,
)
from initializers.journal import CommitLog
from initializers.manifest import (
    FileRecord,
    Manifest,
    manifest_path,
    read_manifest,
    read_manifest_file,
    record_is_intact,
    remove_manifest,
    write_manifest_file,
)
from initializers.progress import Progress, Reporter
from initializers.progress import human_bytes as _gib
from initializers.retry import RetryPolicy
from initializers.sources.base import RemoteFile, Source
from initializers.wholefiles import fetch_whole_files

log = logging.getLogger(__name__)


@dataclass
class Outcome:
    """What a run did, for the closing log line and the tests."""

    files_total: int = 0
    files_fetched: int = 0
    bytes_total: int = 0
    bytes_fetched: int = 0
    bytes_resumed: int = 0
    removed: list[str] = field(default_factory=list)
    up_to_date: bool = False
    seconds: float = 0.0


@dataclass(frozen=True)
class Share:
    """One shard's part of a destination that several initializers fill at once
    (:mod:`initializers.shards`): its own lock, commit log and record of what it committed, in
    the manifest's form. It never removes files nor writes the manifest: the finisher does."""

    index: int
    record: Path
    known: Mapping[str, FileRecord] = field(default_factory=dict)  # other runs' records

    @property
    def lock_name(self) -> str:
        return f".initializer-shard-{self.index}.lock"

    @property
    def commit_log_name(self) -> str:
        return f".initializer-commits-shard-{self.index}.jsonl"


class Engine:
    """Syncs a destination folder with the files a source lists (or a shard's part of them)."""

    def __init__(
        self,
        source: Source,
        dest: Path,
        *,
        workers: int = 16,
        retry: RetryPolicy | None = None,
        label: str = "fetch",
        progress_interval: float = 5.0,
        stop: threading.Event | None = None,
        share: Share | None = None,
    ) -> None:
        self.source = source
        self.dest = dest
        self.share = share
        self._record = share.record if share else manifest_path(dest)
        self.workers = workers
        self.stop = stop or threading.Event()
        # The run's policy, whose backoff sleeps end early on SIGTERM; or one of the same kind.
        self.retry = retry or RetryPolicy(sleep=self.stop.wait)
        self.label = label
        self.progress_interval = progress_interval
        self._commits = CommitLog(dest, share.commit_log_name) if share else CommitLog(dest)
        self._progress = Progress(0, 0, 0)

    # -- planning -------------------------------------------------------------------------------

    def sync(self, files: list[RemoteFile], source_uri: str, revision: str | None) -> Outcome:
        started = time.monotonic()
        self._make_dest()
        lock = FileLock(self.dest / self.share.lock_name, self.stop) if self.share else None
        with lock or destination_lock(self.dest, self.stop):
            outcome = self._sync_locked(files, source_uri, revision)
        outcome.seconds = time.monotonic() - started
        return outcome

    def _make_dest(self) -> None:
        try:
            self.dest.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise storage_error(exc, self.dest) from None
        if not os.access(self.dest, os.W_OK | os.X_OK):
            if os.statvfs(self.dest).f_flag & os.ST_RDONLY:
                raise storage_error(OSError(errno.EROFS, "read-only"), self.dest)
            raise LocalStorageError(
                f"cannot write to {self.dest}: permission denied; make it "
                "writable by this user (fsGroup / permissions)"
            )

    def _sync_locked(
        self, files: list[RemoteFile], source_uri: str, revision: str | None
    ) -> Outcome:
        outcome, kept, jobs = self._plan(files, source_uri, revision)
        if outcome.up_to_date:
            return outcome
        with kept_until_the_end():
            committed = self._fetch_all(jobs)
        outcome.files_fetched = len(committed)
        outcome.bytes_fetched = self._progress.snapshot().bytes_fetched
        kept.update(committed)

        for folder in {path.rpartition("/")[0] for path in committed}:  # not 2,000 Paths: 14 ms
            fsync_dir(self.dest / folder)
        manifest = Manifest(source=source_uri, revision=revision, files=kept)
        try:
            write_manifest_file(self._record, manifest)
        except OSError as exc:
            raise storage_error(exc, self._record) from None
        self._commits.remove()
        return outcome

    @collection_paused()  # what it builds lives until the run ends
    def _plan(
        self, files: list[RemoteFile], source_uri: str, revision: str | None
    ) -> tuple[Outcome, dict[str, FileRecord], list[FileJob]]:
        """What is in place, what is stale (removed here) and the jobs for the rest; an
        outcome marked up to date when there is nothing to do."""
        old = read_manifest_file(self._record)
        ours: dict[str, FileRecord] = {}
        if self.share:  # what the last complete tree and earlier runs' shards committed counts
            complete = read_manifest(self.dest)
            ours.update(complete.files if complete else {})
            ours.update(self.share.known)
        ours.update(old.files if old else {})
        ours.update(self._commits.load())
        kept: dict[str, FileRecord] = {}
        todo: list[RemoteFile] = []
        for remote in files:
            record = ours.get(remote.path)
            if (
                record
                and record.version == remote.version
                and record.size == remote.size
                and record_is_intact(self.dest, remote.path, record)
            ):
                kept[remote.path] = record
            else:
                todo.append(remote)
        listed = {f.path for f in files}
        stale = [] if self.share else sorted(path for path in ours if path not in listed)
        outcome = Outcome(files_total=len(files), bytes_total=sum(f.size for f in files))
        if (
            not todo
            and not stale
            and old is not None
            and old.source == source_uri
            and old.revision == revision
        ):
            outcome.up_to_date = True
            self._commits.remove()  # left behind by a run killed just after its manifest
            return outcome, kept, []

        remove_manifest(self.dest)  # the tree is about to change
        self._record.unlink(missing_ok=True)
        outcome.removed = self._remove_stale(stale)
        jobs = self._plan_jobs(todo)
        outcome.bytes_resumed = sum(job.present for job in jobs)
        self._check_space(jobs)
        self._progress = Progress(
            len(files),
            outcome.bytes_total,
            sum(r.size for r in kept.values()) + outcome.bytes_resumed,
            files_present=len(kept),
        )
        if jobs:
            log.info(
                "%s: fetching %d of %d files (%s)%s",
                self.label,
                len(jobs),
                len(files),
                _gib(sum(j.remote.size for j in jobs)),
                f", resuming {_gib(outcome.bytes_resumed)} already on disk"
                if outcome.bytes_resumed
                else "",
            )
        return outcome, kept, jobs

    def _remove_stale(self, stale: list[str]) -> list[str]:
        """Delete files a previous run committed that the source no longer lists."""
        removed = []
        for path in stale:
            target = self.dest / path
            if not inside(self.dest, target):
                log.warning("%s: not removing %s: it is outside the destination", self.label, path)
                continue
            if target.is_file() and not target.is_symlink():
                target.unlink()
                removed.append(path)
        if removed:
            log.info("%s: removed %d file(s) no longer in the source", self.label, len(removed))
        return removed

    def _plan_jobs(self, todo: list[RemoteFile]) -> list[FileJob]:
        """A job per file, largest first (the shortest tail). A resumable file's folder is
        readied now, as its .part is looked at; the others' wait for their first request."""
        made: set[Path] = set()  # this run's folders, created or checked once (per process)
        room = partial(make_room_for, self.dest, made=made, where="the source")
        jobs = []
        for remote in sorted(todo, key=lambda f: -f.size):
            job = FileJob(remote, self.dest, room)
            if job.resumable:
                job.make_room()
            job.plan()
            jobs.append(job)
        return jobs

    def _check_space(self, jobs: list[FileJob]) -> None:
        needed = sum(job.remote.size - job.present for job in jobs)
        free = shutil.disk_usage(self.dest).free
        if needed > free:
            raise LocalStorageError(
                f"{self.dest} has {_gib(free)} free but the fetch needs "
                f"{_gib(needed)} more; free space or use a bigger volume"
            )

    # -- fetching -------------------------------------------------------------------------------

    def _fetch_all(self, jobs: list[FileJob]) -> dict[str, FileRecord]:
        """Fetch and commit every job, sharing many small files with forked processes."""
        small = [job for job in jobs if len(job.ranges) == 1]
        count = processes.process_count(len(small), self.workers)
        if count == 1:
            with Reporter(self._progress, self.label, self.progress_interval):
                return self._run_jobs(jobs, self.workers)
        shares = [small[i::count] for i in range(count)]
        mine = [job for job in jobs if len(job.ranges) != 1] + shares[0]
        each = max(1, self.workers // count)
        self.source.close()  # a pooled connection must never be shared with a child
        # Forked before any other thread of this process starts (the reporter, the workers).
        children = [
            processes.fork(partial(self._run_child, share, each), self.stop) for share in shares[1:]
        ]
        log.debug("%s: %d worker processes share %d files", self.label, count, len(small))
        relay = threading.Thread(
            target=processes.gather,
            args=(children, self.stop, self._progress.add_counts),
            name="children",
        )
        own: BaseException | None = None
        committed: dict[str, FileRecord] = {}
        with Reporter(self._progress, self.label, self.progress_interval):
            relay.start()
            try:
                committed = self._run_jobs(mine, max(1, self.workers - each * (count - 1)))
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
        for child in children:
            committed.update(child.result or {})
        return committed

    def _run_child(
        self, jobs: list[FileJob], workers: int, progress: processes.ForwardedProgress
    ) -> dict[str, FileRecord]:
        """A forked child's whole life: its share of the files, progress sent to the parent."""
        self._progress = progress  # type: ignore[assignment]
        return self._run_jobs(jobs, workers)

    def _run_jobs(self, jobs: list[FileJob], workers: int) -> dict[str, FileRecord]:
        """Run ``jobs`` with ``workers`` requests in flight in this process (small files: more,
        see :data:`SMALL_IN_FLIGHT`); their verified files, committed."""
        group = GroupCommit(self.dest, self._commits)  # one per run of jobs (per process)
        fetcher = FileFetcher(self.source, self.retry, self.stop, self._progress, group)

        def run_range(
            job: FileJob, start: int, end: int, failed: TransientError | None = None
        ) -> None:
            job.make_room()  # before the request: what is planted after it is replaced
            fetcher.fetch_range(job, start, end, failed)
            if job.range_finished():
                fetcher.commit(job)

        def after_failure(job: FileJob, failure: Exception) -> None:
            """A small file the native loop could not fetch, the workers' way: a final failure
            ends the run as it would have here, a transient one counts in the retry budget."""
            if isinstance(failure, InitializerError):
                raise failure
            transient = failure if isinstance(failure, TransientError) else None
            run_range(job, 0, job.remote.size, transient)

        # Small files fetched whole on the native loop, where the source can (wholefiles.py);
        # the workers then only verify and commit them.
        whole = [
            job
            for job in jobs
            if self.source.fetches_whole
            and job.remote.size <= SMALL_BODY
            and job.ranges == [(0, job.remote.size)]
        ]
        picked = {id(job) for job in whole}
        # Small files' requests wait in threads unless the loop has them: then a thread a worker.
        # Large ranges run on ``workers`` threads of their own: each keeps its read-back buffers
        # (RSS on the Hub model: 189 MiB when they ran on the small files' threads too, not 132).
        small_threads = workers if whole else workers * SMALL_IN_FLIGHT
        futures: list[Future[None]] = []

        def stop_on_failure(future: Future[None]) -> None:
            if not future.cancelled() and future.exception() is not None:
                self.stop.set()

        try:
            with (
                ThreadPoolExecutor(workers, thread_name_prefix="fetch") as large,
                ThreadPoolExecutor(small_threads, thread_name_prefix="small") as small,
            ):

                def submit(
                    pool: ThreadPoolExecutor, task: Callable[..., None], *args: Any
                ) -> Future[None]:
                    future = pool.submit(task, *args)
                    future.add_done_callback(stop_on_failure)
                    futures.append(future)  # atomic: the loop thread appends too
                    return future

                for job in jobs:
                    if not job.ranges:
                        submit(small, fetcher.commit, job)
                rest = [job for job in jobs if id(job) not in picked]
                for job, (start, end) in interleaved(rest, max(1, workers // 2)):
                    pool = small if end - start <= SMALL_BODY else large
                    submit(pool, run_range, job, start, end)

                def commit_streamed(job: FileJob) -> Future[None] | None:
                    """On the loop: queued for commit at once, unless a worker must see to it
                    (its digest did not match: it is fetched again)."""
                    if fetcher.commit_streamed(job):
                        return None
                    return submit(small, fetcher.commit, job)

                if whole:
                    fetch = partial(
                        fetch_whole_files,
                        self.source,
                        whole,
                        in_flight=min(workers * LOOP_PER_WORKER, MAX_BODIES_IN_FLIGHT),
                        stop=self.stop,
                        progress=self._progress,
                        fetched=commit_streamed,
                        failed=lambda job, exc: submit(small, after_failure, job, exc),
                    )
                    native.run_on_loop(fetch, self.stop)
                while pending := [future for future in futures if not future.done()]:
                    done, _ = wait(pending, return_when=FIRST_EXCEPTION)
                    if self.stop.is_set() or any(not f.cancelled() and f.exception() for f in done):
                        self.stop.set()
                        for future in pending:
                            future.cancel()
                errors = [f.exception() for f in futures if not f.cancelled() and f.exception()]
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
            raise Interrupted("stopped by a signal; rerun to resume (fetched bytes are kept)")
        try:
            group.flush()
        except OSError as exc:
            raise storage_error(exc, self.dest) from None
        return group.records


def describe_outcome(label: str, outcome: Outcome) -> str:
    if outcome.up_to_date:
        return (
            f"{label}: already complete ({outcome.files_total} files, "
            f"{_gib(outcome.bytes_total)}); nothing to fetch"
        )
    rate = outcome.bytes_fetched / outcome.seconds / MIB if outcome.seconds else 0.0
    resumed = f", {_gib(outcome.bytes_resumed)} resumed" if outcome.bytes_resumed else ""
    return (
        f"{label}: done — {outcome.files_fetched} fetched, "
        f"{outcome.files_total - outcome.files_fetched} already present{resumed}, "
        f"{_gib(outcome.bytes_fetched)} transferred in {outcome.seconds:.1f}s "
        f"({rate:.1f} MiB/s)"
    )

"""The transfer engine: one implementation of fetching, for every source and both assets.

A run has a few rooms, each a module: planning (:mod:`initializers.planning`: what is in place,
what is stale, a job per file left), scheduling (:mod:`initializers.scheduling`: the thread
pools, the native loop and the forked worker processes), one file's life (its fetch and
verification in :mod:`initializers.fetching`, its state on disk in :mod:`initializers.filejob`)
and commit (batched durable renames in :mod:`initializers.commits`). This module is the hall
between them: it takes the destination's lock, runs the plan, has it scheduled, and writes the
manifest last. The destination's lock and write errors are :mod:`initializers.destination`'s.

On disk, under the destination::

    NAME                        committed files (final names only ever hold complete files)
    .NAME.part                  bytes being fetched, at their final offsets
    .NAME.part.journal          which intervals of the .part are done (large files only)
    .initializer-commits.jsonl  files committed by a run that has not finished yet
    .initializer-manifest.json  written last: the folder is complete
    .initializer.lock           held while a run works on the folder
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from initializers import unchanged
from initializers.destination import FileLock, destination_lock, storage_error
from initializers.errors import InitializerError, LocalStorageError
from initializers.filetable import as_table
from initializers.fsutil import boot_id
from initializers.inflight import MIB, TINY_IN_FLIGHT
from initializers.journal import CommitLog
from initializers.manifest import manifest_path, write_manifest_records
from initializers.planning import Destination, Outcome, Plan
from initializers.progress import human_bytes
from initializers.retry import RetryPolicy
from initializers.scheduling import Scheduler
from initializers.selection import Chooser
from initializers.sources.base import Listing, Order, RemoteFile, Source

log = logging.getLogger(__name__)

# Of a listing still arriving, the files planned before the worker processes fork: as many as
# two processes keep in flight at most at first (a page of 1,000 took ~14 ms to plan before the
# first GET could go). The listing's thread plans the rest of the page as the first requests run.
FIRST_BITE = 2 * TINY_IN_FLIGHT


@dataclass(frozen=True)
class Share:
    """One shard's part of a destination that several initializers fill at once
    (:mod:`initializers.shards`): its own lock, commit log and record of what it committed, in
    the manifest's form. It never removes files nor writes the manifest: the finisher does."""

    index: int
    record: Path
    known: tuple[Path, ...] = ()  # record files of every shard of any run

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
        durable: bool = True,
    ) -> None:
        self.source = source
        self.dest = dest
        self.share = share
        self.stop = stop or threading.Event()
        name = share.commit_log_name if share else CommitLog.NAME
        commits = CommitLog(dest, name, durable=durable)
        self.destination = Destination(
            dest,
            share.record if share else manifest_path(dest),
            commits,
            label,
            share.known if share else None,
        )
        self.scheduler = Scheduler(
            source,
            dest,
            commits,
            workers=workers,
            # The run's policy, whose backoff sleeps end early on SIGTERM; or one of the same kind.
            retry=retry or RetryPolicy(sleep=self.stop.wait),
            stop=self.stop,
            label=label,
            progress_interval=progress_interval,
        )

    def sync(
        self, files: Iterable[RemoteFile] | Chooser, source_uri: str, revision: str | None
    ) -> Outcome:
        """Fetch ``files``: chosen already, or a chooser over a listing that may still be
        arriving (then fetching starts with its first page)."""
        started = time.monotonic()
        self._make_dest()
        if not isinstance(files, Chooser):  # chosen: every file is taken, none conflicts
            files = Chooser(Listing(revision, as_table(files), order=Order.TREE))
        lock = FileLock(self.dest / self.share.lock_name, self.stop) if self.share else None
        with lock or destination_lock(self.dest, self.stop):
            outcome = self._sync_locked(files, source_uri, revision)
        outcome.seconds = time.monotonic() - started
        return outcome

    def proven_unchanged(
        self, chooser: Chooser, source_uri: str, revision: str | None
    ) -> Outcome | None:
        """The outcome of a fetch with nothing to do, when the folder is proven to be exactly
        what the source lists now (the asset store's check of an entry it would link); None
        when it is not, or cannot be proven so without a plan. Writes nothing either way."""
        started = time.monotonic()
        with destination_lock(self.dest, self.stop):
            outcome = self._unchanged(chooser, source_uri, revision)
        if outcome is not None:
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

    def _sync_locked(self, chooser: Chooser, source_uri: str, revision: str | None) -> Outcome:
        if (proven := self._unchanged(chooser, source_uri, revision)) is not None:
            return proven
        planned = Plan(self.destination, chooser, source_uri, revision, self.stop)
        if planned.streamed:  # the processes fork on a first bite; the listing's thread plans on
            planned.advance(done=False, limit=FIRST_BITE)
        else:
            planned.advance(done=True)
        outcome = planned.outcome
        if outcome.up_to_date:
            return outcome
        if planned.streamed:
            log.info(
                "%s: more than a page to list: each page's files are fetched as it arrives",
                self.destination.label,
            )
        try:
            outcome.files_fetched = self.scheduler.fetch_all(planned, planned.progress)
        except InitializerError:
            planned.listed(timeout=1.0)  # the listing's failure, when it stopped the fetch
            raise
        planned.listed()
        if outcome.up_to_date:
            return outcome
        planned.keep_committed(self.destination.commits)
        outcome.bytes_fetched = planned.progress.snapshot().bytes_fetched
        record = self.destination.record
        try:
            write_manifest_records(
                record,
                source_uri,
                revision,
                planned.records(),
                boot_id=boot_id(),
                durable=self.destination.commits.durable,
            )
        except OSError as exc:
            raise storage_error(exc, record) from None
        self.destination.commits.remove()
        return outcome

    def _unchanged(self, chooser: Chooser, source_uri: str, revision: str | None) -> Outcome | None:
        """The outcome of a rerun the manifest proves has nothing to do, checked in parallel
        key ranges (:mod:`initializers.unchanged`); None: plan it."""
        if self.share is not None or self.destination.commits.path.exists():
            return None
        check = unchanged.Check(
            self.source,
            self.dest,
            self.destination.record,
            chooser.allow,
            chooser.ignore,
            self.stop,
            self.destination.label,
            self.scheduler.workers,
        )
        tally = unchanged.unchanged(check, chooser, source_uri, revision)
        if tally is None:
            return None
        unchanged.report(chooser, tally)
        return Outcome(files_total=tally.files, bytes_total=tally.size, up_to_date=True)


def describe_outcome(label: str, outcome: Outcome) -> str:
    if outcome.up_to_date:
        return (
            f"{label}: already complete ({outcome.files_total} files, "
            f"{human_bytes(outcome.bytes_total)}); nothing to fetch"
        )
    rate = outcome.bytes_fetched / outcome.seconds / MIB if outcome.seconds else 0.0
    resumed = f", {human_bytes(outcome.bytes_resumed)} resumed" if outcome.bytes_resumed else ""
    return (
        f"{label}: done — {outcome.files_fetched} fetched, "
        f"{outcome.files_total - outcome.files_fetched} already present{resumed}, "
        f"{human_bytes(outcome.bytes_fetched)} transferred in {outcome.seconds:.1f}s "
        f"({rate:.1f} MiB/s)"
    )

"""Planning: what is already in place, what is stale, and a job for each file still to fetch.

Given the files a source lists and the records of earlier runs (the manifest, a killed run's
commit log, and for a shard the other shards' records), it keeps every file whose record still
matches the listing and the disk, removes what the source no longer lists, checks the space the
rest needs, and returns a job per file to fetch, largest first (the shortest tail).
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from initializers.destination import inside
from initializers.errors import LocalStorageError
from initializers.filejob import FileJob
from initializers.fsutil import make_room_for
from initializers.heap import collection_paused
from initializers.journal import CommitLog
from initializers.manifest import (
    FileRecord,
    read_manifest,
    read_manifest_file,
    record_is_intact,
    remove_manifest,
)
from initializers.progress import Progress, human_bytes
from initializers.sources.base import RemoteFile

log = logging.getLogger("initializers.engine")


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


@dataclass
class Plan:
    outcome: Outcome
    kept: dict[str, FileRecord]  # files in place, as the manifest will record them
    jobs: list[FileJob]  # the rest, largest first
    progress: Progress


@dataclass(frozen=True)
class Destination:
    """Where a plan's records live: the folder, its record file (the manifest, or a shard's
    record), its commit log and, for a shard, what other runs of the fetch committed."""

    dest: Path
    record: Path
    commits: CommitLog
    label: str
    earlier: Mapping[str, FileRecord] | None = None  # None: not shared with other shards


@collection_paused()  # what it builds lives until the run ends
def plan(
    where: Destination, files: list[RemoteFile], source_uri: str, revision: str | None
) -> Plan:
    """What is in place, what is stale (removed here) and the jobs for the rest; an outcome
    marked up to date when there is nothing to do."""
    old = read_manifest_file(where.record)
    ours = _earlier_records(where, old.files if old else {})
    kept: dict[str, FileRecord] = {}
    todo: list[RemoteFile] = []
    for remote in files:
        record = ours.get(remote.path)
        if (
            record
            and record.version == remote.version
            and record.size == remote.size
            and record_is_intact(where.dest, remote.path, record)
        ):
            kept[remote.path] = record
        else:
            todo.append(remote)
    listed = {f.path for f in files}
    stale = [] if where.earlier is not None else sorted(p for p in ours if p not in listed)
    outcome = Outcome(files_total=len(files), bytes_total=sum(f.size for f in files))
    unchanged = old is not None and old.source == source_uri and old.revision == revision
    if not todo and not stale and unchanged:
        outcome.up_to_date = True
        where.commits.remove()  # left behind by a run killed just after its manifest
        return Plan(outcome, kept, [], Progress(0, 0, 0))

    remove_manifest(where.dest)  # the tree is about to change
    where.record.unlink(missing_ok=True)
    outcome.removed = _remove_stale(where, stale)
    jobs = _plan_jobs(where.dest, todo)
    outcome.bytes_resumed = sum(job.present for job in jobs)
    _check_space(where.dest, jobs)
    progress = Progress(
        len(files),
        outcome.bytes_total,
        sum(r.size for r in kept.values()) + outcome.bytes_resumed,
        files_present=len(kept),
    )
    if jobs:
        resumed = outcome.bytes_resumed
        log.info(
            "%s: fetching %d of %d files (%s)%s",
            where.label,
            len(jobs),
            len(files),
            human_bytes(sum(j.remote.size for j in jobs)),
            f", resuming {human_bytes(resumed)} already on disk" if resumed else "",
        )
    return Plan(outcome, kept, jobs, progress)


def _earlier_records(
    where: Destination, recorded: Mapping[str, FileRecord]
) -> dict[str, FileRecord]:
    """Every record an earlier run left: for a shard, the last complete tree's and the other
    runs' shards' first; then this record's; then a killed run's commit log."""
    ours: dict[str, FileRecord] = {}
    if where.earlier is not None:
        complete = read_manifest(where.dest)
        ours.update(complete.files if complete else {})
        ours.update(where.earlier)
    ours.update(recorded)
    ours.update(where.commits.load())
    return ours


def _remove_stale(where: Destination, stale: list[str]) -> list[str]:
    """Delete files a previous run committed that the source no longer lists."""
    removed = []
    for path in stale:
        target = where.dest / path
        if not inside(where.dest, target):
            log.warning("%s: not removing %s: it is outside the destination", where.label, path)
            continue
        if target.is_file() and not target.is_symlink():
            target.unlink()
            removed.append(path)
    if removed:
        log.info("%s: removed %d file(s) no longer in the source", where.label, len(removed))
    return removed


def _plan_jobs(dest: Path, todo: list[RemoteFile]) -> list[FileJob]:
    """A job per file, largest first (the shortest tail). A resumable file's folder is readied
    now, as its .part is looked at; the others' wait for their first request."""
    made: set[Path] = set()  # this run's folders, created or checked once (per process)
    room = partial(make_room_for, dest, made=made, where="the source")
    jobs = []
    for remote in sorted(todo, key=lambda f: -f.size):
        job = FileJob(remote, dest, room)
        if job.resumable:
            job.make_room()
        job.plan()
        jobs.append(job)
    return jobs


def _check_space(dest: Path, jobs: list[FileJob]) -> None:
    needed = sum(job.remote.size - job.present for job in jobs)
    free = shutil.disk_usage(dest).free
    if needed > free:
        raise LocalStorageError(
            f"{dest} has {human_bytes(free)} free but the fetch needs "
            f"{human_bytes(needed)} more; free space or use a bigger volume"
        )

"""Planning: what is already in place, what is stale, and the jobs for each file still to fetch.

Given the files a source lists and the records of earlier runs (the manifest, a killed run's
commit log, and for a shard the other shards' records), it keeps every file whose record still
matches the listing and the disk, removes what the source no longer lists, checks the space the
rest needs, and hands out the jobs for the rest in windows, largest first (the shortest tail).

Everything that grows with the number of files lives in the run's scratch database
(:mod:`initializers.filetable`), not in memory: the earlier records, the files to fetch and the
records of the files in place. A window's jobs are the only per-file objects a run holds.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from initializers import checksum as checksums
from initializers.destination import inside
from initializers.errors import LocalStorageError
from initializers.filejob import CHECKPOINT, RANGE_SIZE, FileJob
from initializers.filetable import BATCH, COLUMNS, FileTable, as_table, row_to_file
from initializers.fsutil import boot_id, make_room_for
from initializers.journal import CommitLog
from initializers.manifest import (
    FileRecord,
    manifest_path,
    manifest_records,
    read_manifest_head,
    record_is_intact,
    remove_manifest,
)
from initializers.progress import Progress, human_bytes
from initializers.sources.base import RemoteFile

log = logging.getLogger("initializers.engine")

WINDOW = 4096  # jobs a process holds at a time, however many files (~2.3 KiB each with its futures)
_RECORD = "path TEXT PRIMARY KEY, size INTEGER, checksum TEXT, version TEXT, mtime_ns INTEGER"


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
class Destination:
    """Where a plan's records live: the folder, its record file (the manifest, or a shard's
    record), its commit log and, for a shard, what other runs of the fetch committed."""

    dest: Path
    record: Path
    commits: CommitLog
    label: str
    earlier: Mapping[str, FileRecord] | None = None  # None: not shared with other shards


class Plan:
    """A planned run: its outcome so far, its progress, the jobs to run in windows, and the
    records of every file in place (kept, then committed as the windows finish)."""

    def __init__(self, where: Destination, files: FileTable, outcome: Outcome) -> None:
        self.where = where
        self.outcome = outcome
        self.progress = Progress(0, 0, 0)
        self.todo = files.sibling()
        self._db = files.db
        self._final = files.scratch.new_name("final")
        self._db.execute(f"CREATE TABLE {self._final} ({_RECORD})")

    def keep(self, records: Iterable[tuple[str, FileRecord]]) -> None:
        """Note files in place (kept or just committed), for the manifest."""
        self._db.executemany(
            f"INSERT OR REPLACE INTO {self._final} VALUES (?, ?, ?, ?, ?)", _rows(records)
        )

    def kept(self) -> tuple[int, int]:
        """How many files, and bytes, are in place so far."""
        count, size = self._db.execute(
            f"SELECT COUNT(*), COALESCE(SUM(size), 0) FROM {self._final}"
        ).fetchone()
        return int(count), int(size)

    def records(self) -> Iterator[tuple[str, FileRecord]]:
        """Every file in place, in path order (the manifest's)."""
        cursor = self._db.execute(f"SELECT * FROM {self._final} ORDER BY path")
        while rows := cursor.fetchmany(BATCH):
            for path, size, checksum, version, mtime_ns in rows:
                yield path, FileRecord(size, checksum, version, mtime_ns)

    def small_files(self) -> int:
        """Files to fetch in one range: those worker processes may share."""
        (count,) = self._db.execute(
            f"SELECT COUNT(*) FROM {self.todo.name} WHERE size <= ?", (RANGE_SIZE,)
        ).fetchone()
        return int(count)

    def windows(self, share: int = 0, count: int = 1) -> Iterator[list[FileJob]]:
        """Share ``share`` of ``count`` processes' jobs, largest first, ``WINDOW`` at a time,
        each window's made as it is due. The small files are dealt out in turn by size, so
        each share gets as many bytes; share 0 (the parent) also takes every larger file.
        Another process than the one that planned reads the plan through a connection of
        its own (a connection must not cross a fork)."""
        db = self._db if share == 0 else self.todo.scratch.reader()
        room = partial(make_room_for, self.where.dest, made=set(), where="the source")
        rows = db.execute(
            f"SELECT {COLUMNS} FROM (SELECT *, CASE WHEN size > :large THEN 0 ELSE "
            f"(ROW_NUMBER() OVER (PARTITION BY size > :large ORDER BY size DESC, seq) - 1) "
            f"% :count END AS share FROM {self.todo.name}) "
            "WHERE share = :share ORDER BY size DESC, seq",
            {"large": RANGE_SIZE, "count": count, "share": share},
        )
        while batch := rows.fetchmany(WINDOW):
            yield [_job(row_to_file(row), self.where.dest, room) for row in batch]

    def keep_committed(self, commits: CommitLog) -> None:
        """Note the files this run committed (every process's, from the commit log), for
        the manifest: the last record of a path wins, and only paths this run fetched."""
        staged = self.todo.scratch.new_name("committed")
        self._db.execute(f"CREATE TABLE {staged} ({_RECORD})")
        self._db.executemany(
            f"INSERT OR REPLACE INTO {staged} VALUES (?, ?, ?, ?, ?)", _rows(commits.records())
        )
        self._db.execute(
            f"INSERT OR REPLACE INTO {self._final} SELECT * FROM {staged} "
            f"WHERE path IN (SELECT path FROM {self.todo.name})"
        )
        self._db.commit()


def plan(
    where: Destination, files: Iterable[RemoteFile], source_uri: str, revision: str | None
) -> Plan:
    """What is in place, what is stale (removed here) and the jobs for the rest; an outcome
    marked up to date when there is nothing to do."""
    listed = as_table(files)
    head = read_manifest_head(where.record)
    planned = Plan(where, listed, Outcome(len(listed), bytes_total=listed.total_bytes))
    earlier = _earlier_records(where, listed, head is not None)
    batch: list[tuple[str, FileRecord]] = []
    suspect_checked = 0
    for remote, found in _with_records(listed, earlier):
        record = _in_place(where.dest, remote, found)
        suspect_checked += found is not None and not found[2]
        if record is not None:
            batch.append((remote.path, record))
            if len(batch) >= BATCH:
                planned.keep(batch)
                batch.clear()
        else:
            planned.todo.append(remote)
    if suspect_checked:
        log.info(
            "%s: %d file(s) were written unsynced before the last boot: their bytes were "
            "checked against their digests before being kept",
            where.label,
            suspect_checked,
        )
    planned.keep(batch)
    planned.todo.flush()
    listed.db.commit()
    stale = [] if where.earlier is not None else _stale(listed, earlier)
    unchanged = head is not None and head.source == source_uri and head.revision == revision
    if not planned.todo and not stale and unchanged:
        planned.outcome.up_to_date = True
        where.commits.remove()  # left behind by a run killed just after its manifest
        return planned

    remove_manifest(where.dest)  # the tree is about to change
    where.record.unlink(missing_ok=True)
    planned.outcome.removed = _remove_stale(where, stale)
    resumed = _check_space(where.dest, planned.todo)
    planned.outcome.bytes_resumed = resumed
    kept_count, kept_bytes = planned.kept()
    planned.progress = Progress(
        len(listed), listed.total_bytes, kept_bytes + resumed, files_present=kept_count
    )
    if planned.todo:
        log.info(
            "%s: fetching %d of %d files (%s)%s",
            where.label,
            len(planned.todo),
            len(listed),
            human_bytes(planned.todo.total_bytes),
            f", resuming {human_bytes(resumed)} already on disk" if resumed else "",
        )
    return planned


def _job(remote: RemoteFile, dest: Path, room: Callable[[Path], None]) -> FileJob:
    """A file's job, its ranges planned. A resumable file's folder is readied now, as its
    .part is looked at; the others' wait for their first request."""
    job = FileJob(remote, dest, room)
    if job.resumable:
        job.make_room()
    job.plan()
    return job


Trusted = tuple[str, FileRecord, bool]  # a record, and whether size and mtime vouch for it


def _earlier_records(where: Destination, listed: FileTable, recorded: bool) -> str:
    """A table of every record an earlier run left, by path: for a shard, the last complete
    tree's and the other runs' shards' first; then this record's; then a killed run's commit
    log (later ones win). A manifest unreadable anywhere counts for none of its files. Records
    of files written unsynced before the last boot are marked suspect: a crash may have lost
    their bytes while their names, sizes and mtimes stayed."""
    db = listed.db
    name, staged = listed.scratch.new_name("earlier"), listed.scratch.new_name("staged")
    db.execute(f"CREATE TABLE {name} ({_RECORD}, suspect INTEGER)")
    db.execute(f"CREATE TABLE {staged} ({_RECORD}, suspect INTEGER)")
    booted = boot_id()
    sources: list[Callable[[], Iterable[Trusted]]] = []
    if where.earlier is not None:
        earlier = where.earlier
        sources.append(partial(_manifest_with_trust, manifest_path(where.dest), booted))
        sources.append(lambda: ((p, r, True) for p, r in earlier.items()))
    if recorded:
        sources.append(partial(_manifest_with_trust, where.record, booted))
    sources.append(partial(where.commits.records_with_trust, booted))
    for records in sources:
        db.execute(f"DELETE FROM {staged}")
        try:
            db.executemany(
                f"INSERT OR REPLACE INTO {staged} VALUES (?, ?, ?, ?, ?, ?)",
                (
                    (p, r.size, r.checksum, r.version, r.mtime_ns, not trusted)
                    for p, r, trusted in records()
                ),
            )
        except ValueError:  # torn or foreign: not trusted for any file
            continue
        db.execute(f"INSERT OR REPLACE INTO {name} SELECT * FROM {staged}")
    db.execute(f"DROP TABLE {staged}")
    return name


def _rows(records: Iterable[tuple[str, FileRecord]]) -> Iterator[tuple[object, ...]]:
    """Records as rows of a ``_RECORD`` table."""
    return ((p, r.size, r.checksum, r.version, r.mtime_ns) for p, r in records)


def _manifest_with_trust(path: Path, booted: str) -> Iterator[Trusted]:
    head = read_manifest_head(path)
    trusted = head is None or head.trusted(booted)  # None: manifest_records raises anyway
    return ((p, r, trusted) for p, r in manifest_records(path))


def _with_records(listed: FileTable, earlier: str) -> Iterator[tuple[RemoteFile, Trusted | None]]:
    """Each listed file with its earlier record, if any, in the order listed."""
    rows = listed.db.execute(
        f"SELECT f.path, f.size, f.version, f.algorithm, f.digest, f.parts, f.locator, "
        f"f.ranged, e.size, e.checksum, e.version, e.mtime_ns, e.suspect FROM {listed.name} f "
        f"LEFT JOIN {earlier} e ON e.path = f.path ORDER BY f.seq"
    )
    while batch := rows.fetchmany(BATCH):
        for row in batch:
            file = row_to_file(row)
            yield file, None if row[8] is None else (file.path, FileRecord(*row[8:12]), not row[12])


def _in_place(dest: Path, remote: RemoteFile, earlier: Trusted | None) -> FileRecord | None:
    """The earlier record of ``remote`` when its file is still the one recorded: same version
    and size as listed, same size and mtime on disk and, for a file a crash may have emptied
    behind an intact name, the recorded digest over its bytes."""
    if earlier is None:
        return None
    path, record, trusted = earlier
    if not (
        record.version == remote.version
        and record.size == remote.size
        and record_is_intact(dest, path, record)
    ):
        return None
    return record if trusted or _bytes_match(dest, path, record) else None


def _bytes_match(dest: Path, path: str, record: FileRecord) -> bool:
    """Whether the file's bytes still have the digest recorded; False when there is none to
    check them with (a digest of parts whose sizes are not recorded, or no digest at all)."""
    algorithm, _, value = (record.checksum or "").partition(":")
    if not value or "-" in value or not checksums.is_supported(algorithm):
        return False
    try:
        fd = os.open(os.path.join(dest, path), os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        return checksums.digest_file(fd, record.size, algorithm) == value
    except OSError:
        return False
    finally:
        os.close(fd)


def _stale(listed: FileTable, earlier: str) -> list[str]:
    """Paths an earlier run committed that the source no longer lists, in path order."""
    rows = listed.db.execute(
        f"SELECT path FROM {earlier} WHERE path NOT IN (SELECT path FROM {listed.name}) "
        "ORDER BY path"
    )
    return [path for (path,) in rows]


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


def _check_space(dest: Path, todo: FileTable) -> int:
    """Refuse a fetch the disk cannot hold; the bytes an interrupted run left that are kept.

    Only a file large enough to be resumed can have bytes on disk already: only those jobs are
    made here (their journal read), the rest count whole."""
    resumed = 0
    for remote in todo.query(
        f"SELECT {COLUMNS} FROM {todo.name} WHERE size > ? AND ranged",
        (CHECKPOINT,),
    ):
        job = FileJob(remote, dest)
        job.plan()
        resumed += job.present
    needed = todo.total_bytes - resumed
    free = shutil.disk_usage(dest).free
    if needed > free:
        raise LocalStorageError(
            f"{dest} has {human_bytes(free)} free but the fetch needs "
            f"{human_bytes(needed)} more; free space or use a bigger volume"
        )
    return resumed

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

import json
import logging
import os
import shutil
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from initializers import checksum as checksums
from initializers.destination import inside
from initializers.errors import STOPPED, Interrupted, LocalStorageError
from initializers.filejob import CHECKPOINT, RANGE_SIZE, FileJob
from initializers.filetable import BATCH, COLUMNS, WIDTH, FileTable, row_to_file
from initializers.fsutil import boot_id, make_room_for
from initializers.interrupts import interrupt_reads
from initializers.journal import CommitLog
from initializers.manifest import (
    FileRecord,
    manifest_path,
    manifest_records,
    read_manifest_head,
    record_is_intact,
    remove_manifest,
)
from initializers.processes import UNCOUNTED
from initializers.progress import Progress, human_bytes
from initializers.selection import Chooser
from initializers.sources.base import RemoteFile

log = logging.getLogger("initializers.engine")

WINDOW = 4096  # jobs a process holds at a time, however many files (~2.3 KiB each with its futures)
POLL_SECONDS = 0.005  # how often a process looks for jobs the listing's thread has planned
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
    earlier: tuple[Path, ...] | None = None  # other shards' record files; None: not shared


class Plan:
    """A run's plan, made as its listing arrives: what is in place (kept), what to fetch (the
    jobs, handed out in windows), what is stale; its outcome and progress.

    A listing read whole is planned at once and its jobs handed out largest first (the
    shortest tail). A listing still arriving is planned a page at a time by a thread of the
    parent's (:meth:`begin`), and each process takes the jobs by arrival as they are planned.
    The manifest goes only when the first file is about to change.
    """

    def __init__(
        self,
        where: Destination,
        chooser: Chooser,
        source_uri: str,
        revision: str | None,
        stop: threading.Event,
        dry: bool = False,
    ) -> None:
        """``dry``: plan as a run would and change nothing (``--dry-run``): no manifest
        removed, no file in the way cleared, nothing stale removed; a folder that does not
        exist yet is planned as empty."""
        self.where = where
        self.dry = dry
        self.chooser = chooser
        self.listing = chooser.listing
        self.streamed = self.listing.rest is not None
        self.source_uri, self.revision = source_uri, revision
        self.stop = stop
        self.outcome = Outcome()
        self.progress = Progress(0, 0, 0, listing=self.streamed)
        self.failure: BaseException | None = None  # the listing's, when it failed
        listed = chooser.listed
        self.todo = listed.sibling()
        self._scratch, self._db = listed.scratch, listed.db
        self._head = read_manifest_head(where.record)
        self._earlier = _earlier_records(where, listed, self._head is not None)
        self._has_earlier = bool(
            self._db.execute(f"SELECT 1 FROM {self._earlier} LIMIT 1").fetchone()
        )
        # No index: a kept path is never fetched, and the committed ones are deduplicated
        # before they join; the manifest sorts them once, when the tree changed.
        self._final = self._table("final", _RECORD.replace(" PRIMARY KEY", ""))
        self._state = self._table("state", "done INTEGER")
        self._db.execute(f"INSERT INTO {self._state} VALUES (0)")
        self._db.commit()
        self._free = shutil.disk_usage(_existing(where.dest)).free
        self._needed = 0
        self._suspect_checked = 0
        self._touched = False  # the tree has begun to change: the manifest is gone
        self._lister: threading.Thread | None = None

    def _table(self, stem: str, columns: str) -> str:
        name = self._scratch.new_name(stem)
        self._db.execute(f"CREATE TABLE {name} ({columns})")
        return name

    # -- planning, page by page ----------------------------------------------------------------

    def advance(self, done: bool, limit: int | None = None) -> None:
        """Plan the files listed since the last call that can be decided now; ``done``: the
        listing is complete, and the plan then ends with the stale files' removal; ``limit``:
        look at no more than that many listed files now."""
        for rows in self.chooser.take(done, limit):
            self._decide(rows)
        self.todo.flush()  # committed: the worker processes read the jobs
        if done:
            self._finish()

    def _decide(self, rows: list[int]) -> None:
        """Keep each of the chosen ``rows`` whose file is in place; make a job for each other.

        A warm rerun of a million files passes every file through here: the earlier record is
        matched to the listing in SQL, and only a file whose version and size still match is
        looked at on disk; only the files to fetch become objects."""
        kept: list[tuple[object, ...]] = []
        refetch: list[tuple[object, ...]] = []
        listed_bytes = kept_bytes = resumed = 0
        files = ", ".join(f"f.{column}" for column in COLUMNS.split(", "))
        for row in self._db.execute(
            f"SELECT {files}, e.version IS f.version AND e.size = f.size, "
            f"e.size, e.checksum, e.version, e.mtime_ns, e.suspect "
            f"FROM {self.chooser.listed.name} f LEFT JOIN {self._earlier} e ON e.path = f.path "
            "WHERE f.seq IN (SELECT value FROM json_each(?)) ORDER BY f.seq",
            (json.dumps(rows),),
        ).fetchall():
            path, size = row[0], row[1]
            matches, *earlier, suspect = row[WIDTH:]
            listed_bytes += size
            self._suspect_checked += bool(suspect)
            if matches and _in_place(self.where.dest, path, FileRecord(*earlier), not suspect):
                kept.append((path, *earlier))
                kept_bytes += size
            else:
                refetch.append(row)
        for row in refetch:
            resumed += self._to_fetch(row_to_file(row))
        self._db.executemany(f"INSERT INTO {self._final} VALUES (?, ?, ?, ?, ?)", kept)
        self.outcome.files_total += len(rows)
        self.outcome.bytes_total += listed_bytes
        self.outcome.bytes_resumed += resumed
        self.progress.grow(len(rows), listed_bytes, kept_bytes + resumed, len(kept))

    def _to_fetch(self, remote: RemoteFile) -> int:
        """A job for ``remote``, once the disk is known to hold it; the bytes an interrupted
        run left of it that are kept."""
        self._touch()
        if self._has_earlier and not self.dry:
            self._clear_way(remote.path)
        present = 0
        if remote.size > CHECKPOINT and remote.ranged and not self.dry:  # bytes on disk?
            job = FileJob(remote, self.where.dest)
            if job.part.exists():  # left by an interrupted run: its journal says what is kept
                job.plan()
                present = job.present
        self._needed += remote.size - present
        if self._needed > self._free:
            raise LocalStorageError(
                f"{self.where.dest} has {human_bytes(self._free)} free but the fetch needs "
                f"{human_bytes(self._needed)} more; free space or use a bigger volume"
            )
        self.todo.append(remote)
        return present

    def _touch(self) -> None:
        """Mark the destination incomplete before its first file changes."""
        if not self._touched:
            self._touched = True
            if self.dry:
                return
            remove_manifest(self.where.dest)
            self.where.record.unlink(missing_ok=True)

    def _clear_way(self, path: str) -> None:
        """Remove a file an earlier run committed where ``path`` needs a folder: a path is never
        both, so the listing no longer has it; it is stale and would go at the end, but the
        job may need its folder before then."""
        folders = []
        folder = path.rpartition("/")[0]
        while folder:
            folders.append(folder)
            folder = folder.rpartition("/")[0]
        if not folders:
            return
        found = self._db.execute(
            f"SELECT path FROM {self._earlier} WHERE path IN (SELECT value FROM json_each(?))",
            (json.dumps(folders),),
        ).fetchall()
        for (stale,) in found:
            target = self.where.dest / stale
            if inside(self.where.dest, target) and target.is_file() and not target.is_symlink():
                target.unlink()

    def _finish(self) -> None:
        """The listing is complete: report the choice, remove what is stale, end the plan."""
        self.chooser.report()
        if self._suspect_checked:
            log.info(
                "%s: %d file(s) were written unsynced before the last boot: their bytes were "
                "checked against their digests before being kept",
                self.where.label,
                self._suspect_checked,
            )
        stale = [] if self.where.earlier is not None else self._stale()
        head = self._head
        unchanged = head is not None and (head.source, head.revision) == (
            self.source_uri,
            self.revision,
        )
        if not self.todo and not stale and unchanged:
            self.outcome.up_to_date = True
            if not self.dry:
                self.where.commits.remove()  # left by a run killed just after its manifest
        elif self.dry:
            self.outcome.removed = stale  # what a run would remove
        else:
            self._touch()
            self.outcome.removed = _remove_stale(self.where, stale)
            self._announce()
        self.progress.listed()
        self._db.execute(f"UPDATE {self._state} SET done = 1")
        self._db.commit()

    def _announce(self) -> None:
        if not self.todo:
            return
        resumed = self.outcome.bytes_resumed
        log.info(
            "%s: %s %d of %d files (%s)%s",
            self.where.label,
            "listed; fetching" if self.streamed else "fetching",
            len(self.todo),
            self.outcome.files_total,
            human_bytes(self.todo.total_bytes),
            f", resuming {human_bytes(resumed)} already on disk" if resumed else "",
        )

    def _stale(self) -> list[str]:
        """Paths an earlier run committed that the source no longer lists, in path order."""
        rows = self._db.execute(
            f"SELECT path FROM {self._earlier} WHERE path NOT IN (SELECT path FROM {self._final})"
            f" AND path NOT IN (SELECT path FROM {self.todo.name}) ORDER BY path"
        )
        return [path for (path,) in rows]

    # -- the listing's thread ------------------------------------------------------------------

    def begin(self) -> None:
        """Plan the rest of a listing still arriving, in a thread, while the jobs run (called
        once the worker processes are forked: a fork copies only its calling thread)."""
        if self.streamed and self._lister is None:
            self._lister = threading.Thread(target=self._list_rest, name="listing", daemon=True)
            self._lister.start()

    def _list_rest(self) -> None:
        assert self.listing.rest is not None
        try:
            self.advance(done=False)  # what is listed already, past the first bite
            for _ in self.listing.rest:
                if self.stop.is_set():
                    return
                self.advance(done=False)
            self.listing.rest = None
            self.advance(done=True)
        except BaseException as exc:  # the run's failure: every worker stops
            self.failure = exc
            self.stop.set()
            interrupt_reads()

    def listed(self, timeout: float | None = None) -> None:
        """Wait for the listing's thread to end (``timeout``: at most that long, when the run
        is failing anyway); raise what it failed with."""
        if self._lister is not None:
            self._lister.join(timeout)
        if self.failure is not None:
            raise self.failure

    # -- the jobs ------------------------------------------------------------------------------

    def small_files(self) -> int:
        """Files to fetch in one range (those worker processes may share); for a listing still
        arriving, as many as a listing of more than a page suggests."""
        if self.streamed:
            return UNCOUNTED
        (count,) = self._db.execute(
            f"SELECT COUNT(*) FROM {self.todo.name} WHERE size <= ?", (RANGE_SIZE,)
        ).fetchone()
        return int(count)

    def windows(self, share: int = 0, count: int = 1) -> Iterator[list[FileJob]]:
        """Share ``share`` of ``count`` processes' jobs, ``WINDOW`` at a time, each window's
        made as it is due. The small files are dealt out in turn (largest first when the plan
        is complete, so each share gets as many bytes); share 0 (the parent) also takes every
        larger file. A process reads the plan through a connection of its own while the
        listing's thread writes it, and after a fork (a connection must not cross one)."""
        room = partial(make_room_for, self.where.dest, made=set(), where="the source")
        if self.streamed:
            batches: Iterator[list[Any]] = self._arriving(share, count)
        else:
            batches = self._largest_first(share, count)
        for rows in batches:
            yield [_job(row_to_file(row), self.where.dest, room) for row in rows]

    def _largest_first(self, share: int, count: int) -> Iterator[list[Any]]:
        db = self._db if share == 0 else self._scratch.reader()
        rows = db.execute(
            f"SELECT {COLUMNS} FROM (SELECT *, CASE WHEN size > :large THEN 0 ELSE "
            f"(ROW_NUMBER() OVER (PARTITION BY size > :large ORDER BY size DESC, seq) - 1) "
            f"% :count END AS share FROM {self.todo.name}) "
            "WHERE share = :share ORDER BY size DESC, seq",
            {"large": RANGE_SIZE, "count": count, "share": share},
        )
        while batch := rows.fetchmany(WINDOW):
            yield batch

    def _arriving(self, share: int, count: int) -> Iterator[list[Any]]:
        """This share's jobs as the listing's thread plans them, in the order planned."""
        db = self._scratch.reader()
        query = (
            f"SELECT {COLUMNS}, seq FROM {self.todo.name} WHERE seq > :cursor AND "
            "(CASE WHEN size > :large THEN 0 ELSE seq % :count END) = :share "
            "ORDER BY seq LIMIT :window"
        )
        given = {"cursor": 0, "large": RANGE_SIZE, "count": count, "share": share}
        while True:
            if self.failure is not None:
                raise self.failure
            if self.stop.is_set():
                raise Interrupted(STOPPED)
            (done,) = db.execute(f"SELECT done FROM {self._state}").fetchone()
            rows = db.execute(query, {**given, "window": WINDOW}).fetchall()
            if rows:
                given["cursor"] = rows[-1][-1]
                yield rows
            elif done:
                return
            else:
                self.stop.wait(POLL_SECONDS)

    # -- the records ---------------------------------------------------------------------------

    def records(self) -> Iterator[tuple[str, FileRecord]]:
        """Every file in place, in path order (the manifest's)."""
        cursor = self._db.execute(f"SELECT * FROM {self._final} ORDER BY path")
        while rows := cursor.fetchmany(BATCH):
            for path, size, checksum, version, mtime_ns in rows:
                yield path, FileRecord(size, checksum, version, mtime_ns)

    def keep_committed(self, commits: CommitLog) -> None:
        """Note the files this run committed (every process's, from the commit log), for
        the manifest: the last record of a path wins, and only paths this run fetched."""
        staged = self._table("committed", _RECORD)
        self._db.executemany(
            f"INSERT OR REPLACE INTO {staged} VALUES (?, ?, ?, ?, ?)", _rows(commits.records())
        )
        self._db.execute(
            f"INSERT INTO {self._final} SELECT * FROM {staged} "
            f"WHERE path IN (SELECT path FROM {self.todo.name})"
        )
        self._db.commit()


def _existing(path: Path) -> Path:
    """``path``, or its nearest folder that exists (a destination not made yet)."""
    while not path.exists() and path.parent != path:
        path = path.parent
    return path


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
        sources.append(partial(_manifest_with_trust, manifest_path(where.dest), booted))
        sources.extend(partial(_manifest_with_trust, found, booted) for found in where.earlier)
    if recorded:
        sources.append(partial(_manifest_with_trust, where.record, booted))
    sources.append(partial(where.commits.records_with_trust, booted))
    empty = True
    for records in sources:
        # Into the table itself while it is empty (a warm rerun's manifest: a million rows
        # copied once, not twice); a source that proves torn then leaves it empty again.
        into = name if empty else staged
        db.execute(f"DELETE FROM {into}")
        try:
            db.executemany(
                f"INSERT OR REPLACE INTO {into} VALUES (?, ?, ?, ?, ?, ?)",
                (
                    (p, r.size, r.checksum, r.version, r.mtime_ns, not trusted)
                    for p, r, trusted in records()
                ),
            )
        except ValueError:  # torn or foreign: not trusted for any file
            db.execute(f"DELETE FROM {into}")
            continue
        if into == staged:
            db.execute(f"INSERT OR REPLACE INTO {name} SELECT * FROM {staged}")
        empty = empty and not db.execute(f"SELECT 1 FROM {name} LIMIT 1").fetchone()
    db.execute(f"DROP TABLE {staged}")
    return name


def _rows(records: Iterable[tuple[str, FileRecord]]) -> Iterator[tuple[object, ...]]:
    """Records as rows of a ``_RECORD`` table."""
    return ((p, r.size, r.checksum, r.version, r.mtime_ns) for p, r in records)


def _manifest_with_trust(path: Path, booted: str) -> Iterator[Trusted]:
    head = read_manifest_head(path)
    trusted = head is None or head.trusted(booted)  # None: manifest_records raises anyway
    return ((p, r, trusted) for p, r in manifest_records(path))


def _in_place(dest: Path, path: str, record: FileRecord, trusted: bool) -> bool:
    """Whether the file an earlier run recorded (its version and size still the listed ones)
    is still on disk as recorded: same size and mtime and, for a file a crash may have emptied
    behind an intact name, the recorded digest over its bytes."""
    if not record_is_intact(dest, path, record):
        return False
    return trusted or _bytes_match(dest, path, record)


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

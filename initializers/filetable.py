"""Listings on disk: a run's files in an SQLite table, so memory does not grow with their count.

A listing of a million keys held as Python objects took gigabytes; the same rows in a table in
a scratch file take a few hundred bytes of disk each and no memory beyond SQLite's page cache
(capped here). A source appends files as its pages arrive; the selection, the plan and the
manifest read them back in batches and ask the questions that need every file (which paths are
also folders, which records of an earlier run are no longer listed) as queries.

The scratch file lives in a folder of its own under ``TMPDIR`` (the run's, not the
destination's: the destination of a shared asset store is known only once the listing is) and
goes when the run ends. It is scratch: nothing in it must survive a crash, so SQLite is told
never to sync; its write-ahead log only lets worker processes read while pages are added.
A run that was killed cannot remove its folder; the next run under the same ``TMPDIR`` does
(a container restarted in its pod keeps its emptyDir, and a million files leave 300-450 MB
behind). A folder is known abandoned by its lock: each run holds one on its own.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import sqlite3
import tempfile
import time
import weakref
from collections.abc import Iterable, Iterator
from pathlib import Path

from initializers.errors import LocalStorageError
from initializers.sources.base import Checksum, RemoteFile

BATCH = 4096  # rows written or read at a time
PAGE_CACHE_KIB = 8192  # SQLite's page cache per scratch database
FOLDER_PREFIX = "initializer-plan-"
SETTLE_SECONDS = 10  # a folder this young may be one a run made but has not locked yet

COLUMNS = "path, size, version, algorithm, digest, parts, locator, ranged, unlisted"
WIDTH = 9  # the columns of a file
_SCHEMA = (
    "seq INTEGER PRIMARY KEY, path TEXT NOT NULL, size INTEGER NOT NULL, version TEXT, "
    "algorithm TEXT, digest TEXT, parts TEXT, locator TEXT NOT NULL, ranged INTEGER NOT NULL, "
    "unlisted INTEGER NOT NULL"
)


class Scratch:
    """One scratch SQLite database: a run's tables that would not fit in memory."""

    def __init__(self) -> None:
        try:
            remove_abandoned(Path(tempfile.gettempdir()))
            self.folder = Path(tempfile.mkdtemp(prefix=FOLDER_PREFIX))
            lock = os.open(self.folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            fcntl.flock(lock, fcntl.LOCK_EX)  # held by this run and its worker processes
            self.db = sqlite3.connect(self.folder / "plan.sqlite", check_same_thread=False)
        except (OSError, sqlite3.Error) as exc:
            raise LocalStorageError(
                f"cannot make the run's scratch file under {tempfile.gettempdir()}: {exc}; "
                "set TMPDIR to a writable folder"
            ) from None
        for pragma in (
            "journal_mode = WAL",  # a worker process reads while the listing is written
            "synchronous = OFF",
            "temp_store = FILE",
            f"cache_size = -{PAGE_CACHE_KIB}",
        ):
            self.db.execute(f"PRAGMA {pragma}")
        self._names = 0
        self._closer = weakref.finalize(self, _remove, self.db, self.folder, lock)

    def reader(self) -> sqlite3.Connection:
        """A connection of this process's own (after a fork), to read what was committed."""
        return sqlite3.connect(f"file:{self.folder / 'plan.sqlite'}?mode=ro", uri=True)

    def new_name(self, stem: str) -> str:
        self._names += 1
        return f"{stem}_{self._names}"

    def close(self) -> None:
        self._closer()


def _remove(db: sqlite3.Connection, folder: Path, lock: int) -> None:
    db.close()
    shutil.rmtree(folder, ignore_errors=True)
    os.close(lock)


def remove_abandoned(parent: Path) -> None:
    """Remove the scratch folders under ``parent`` that no living run holds (runs killed before
    they could remove their own); ones of other users, or not removable, are left alone."""
    try:
        candidates = [p for p in parent.iterdir() if p.name.startswith(FOLDER_PREFIX)]
    except OSError:
        return
    for folder in candidates:
        with contextlib.suppress(OSError):
            _remove_if_abandoned(folder)


def _remove_if_abandoned(folder: Path) -> None:
    if time.time() - folder.stat().st_mtime < SETTLE_SECONDS:
        return
    held = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError: a run holds it
        shutil.rmtree(folder)
    finally:
        os.close(held)


class FileTable:
    """Remote files in the order they were added, kept in a scratch database.

    Iterating reads them back in batches: never hold a list of them. ``len`` and truth are
    cheap. Not for use from two threads at once.
    """

    def __init__(self, scratch: Scratch | None = None) -> None:
        self.scratch = scratch or Scratch()
        self.name = self.scratch.new_name("files")
        self.db.execute(f"CREATE TABLE {self.name} ({_SCHEMA})")
        self._pending: list[tuple[object, ...]] = []
        self._count = 0
        self._bytes = 0

    @property
    def db(self) -> sqlite3.Connection:
        return self.scratch.db

    def paths(self) -> Iterator[tuple[int, str]]:
        """``(row, path)`` of every file, in order: what a question about names needs."""
        self.flush()
        cursor = self.db.execute(f"SELECT seq, path FROM {self.name} ORDER BY seq")
        while rows := cursor.fetchmany(BATCH):
            yield from rows

    def only(self, rows: Iterable[int]) -> FileTable:
        """The given rows of this table: a view over it, nothing copied (itself when every
        row is given). ``rows`` may be read as this table is: they go to a table too."""
        self.flush()
        kept = self.scratch.new_name("kept")
        self.db.execute(f"CREATE TABLE {kept} (seq INTEGER PRIMARY KEY)")
        self.db.executemany(f"INSERT OR IGNORE INTO {kept} VALUES (?)", ((r,) for r in rows))
        (count,) = self.db.execute(f"SELECT COUNT(*) FROM {kept}").fetchone()
        if count == self._count:
            return self
        view = FileTable.__new__(FileTable)
        view.scratch, view.name, view._pending = self.scratch, self.scratch.new_name("view"), []
        self.db.execute(
            f"CREATE VIEW {view.name} AS SELECT * FROM {self.name} "
            f"WHERE seq IN (SELECT seq FROM {kept})"
        )
        self.db.commit()
        count, size = self.db.execute(f"SELECT COUNT(*), SUM(size) FROM {view.name}").fetchone()
        view._count, view._bytes = count, size or 0
        return view

    def sibling(self) -> FileTable:
        """An empty table in the same database (so the two can be joined)."""
        return FileTable(self.scratch)

    def append(self, file: RemoteFile) -> None:
        checksum = file.checksum
        self._pending.append(
            (
                file.path,
                file.size,
                file.version,
                checksum.algorithm if checksum else None,
                checksum.value if checksum else None,
                ",".join(map(str, checksum.parts)) if checksum and checksum.parts else None,
                file.locator,
                int(file.ranged),
                int(file.unlisted_digest),
            )
        )
        self._count += 1
        self._bytes += file.size
        if len(self._pending) >= BATCH:
            self.flush()

    def extend(self, files: Iterable[RemoteFile]) -> None:
        for file in files:
            self.append(file)

    def flush(self) -> None:
        if self._pending:
            self.db.executemany(
                f"INSERT INTO {self.name} ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                self._pending,
            )
            self.db.commit()  # a forked worker reads the table through a connection of its own
            self._pending.clear()

    def __len__(self) -> int:
        return self._count

    def __bool__(self) -> bool:
        return self._count > 0

    @property
    def total_bytes(self) -> int:
        return self._bytes

    def __iter__(self) -> Iterator[RemoteFile]:
        return self.query(f"SELECT {COLUMNS} FROM {self.name} ORDER BY seq")

    def query(self, sql: str, parameters: tuple[object, ...] = ()) -> Iterator[RemoteFile]:
        """Files from a query whose first ``WIDTH`` columns are a row of this table's."""
        self.flush()
        cursor = self.db.execute(sql, parameters)
        while rows := cursor.fetchmany(BATCH):
            for row in rows:
                yield row_to_file(row)


def row_to_file(row: tuple[object, ...]) -> RemoteFile:
    path, size, version, algorithm, digest, parts, locator, ranged, unlisted = row[:WIDTH]
    checksum = None
    if algorithm is not None:
        sizes = tuple(int(p) for p in str(parts).split(",")) if parts else ()
        checksum = Checksum(str(algorithm), str(digest), sizes)
    return RemoteFile(
        str(path),
        int(size),  # type: ignore[call-overload]
        None if version is None else str(version),
        checksum,
        str(locator),
        bool(ranged),
        bool(unlisted),
    )


def as_table(files: Iterable[RemoteFile]) -> FileTable:
    """``files`` as a table: itself when it is one, else a new table holding them."""
    if isinstance(files, FileTable):
        return files
    table = FileTable()
    table.extend(files)
    table.flush()
    return table

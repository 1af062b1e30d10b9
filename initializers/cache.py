"""The shared asset store: one fetch per source version, linked into many TrainJobs' workspaces.

An entry is an ordinary destination (files, journal, manifest), named by a key derived from what
the caller's own listing resolved: the source, its revision, the patterns, and every listed
file's path, size, version and checksum. A changed source therefore gets a new entry, and an
unchanged one is found again without trusting anything but the manifest's size and mtime checks
the engine already makes. The output folder becomes a symlink to the entry.

Under ``CACHE_DIR``::

    entries/NAME/                       one entry: the fetched tree and its manifest
    entries/NAME/.initializer-cache.json  where it came from, its size, when it was last used
    entries/NAME.lock                   held while an initializer fills or links NAME, or prune
                                        removes it
    entries/NAME.readers                held (shared) by every training that reads NAME through
                                        its link, so prune leaves NAME alone meanwhile
    .trash/                             entries prune is deleting

NAME is a readable slug of the source and 24 hex digits of the key.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from initializers.destination import FileLock, storage_error
from initializers.entryhold import ENTRIES
from initializers.errors import LocalStorageError
from initializers.filetable import COLUMNS, FileTable
from initializers.fsutil import atomic_write_bytes
from initializers.manifest import find_problems, manifest_totals
from initializers.progress import human_bytes
from initializers.retry import RetryPolicy
from initializers.sources.base import RemoteFile, Source

if TYPE_CHECKING:
    from initializers.engine import Outcome

log = logging.getLogger(__name__)

TRASH = ".trash"
INFO_NAME = ".initializer-cache.json"
_SLUG_UNSAFE = re.compile(r"[^a-z0-9.]+")


def material_digest(material: dict[str, object]) -> str:
    """A hex digest that changes whenever anything in ``material`` does: the SHA-256 of its
    JSON text with sorted keys. Its ``files`` (rows, any number of them) are encoded a row at
    a time, never whole; the digest is the one of the whole text."""
    if "files" not in material:
        return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()
    rest = {key: value for key, value in material.items() if key != "files"}
    before, _, after = json.dumps({**rest, "files": None}, sort_keys=True).partition(
        '"files": null'
    )
    digest = hashlib.sha256(f'{before}"files": ['.encode())
    encode = json.JSONEncoder().encode
    for index, row in enumerate(material["files"]):  # type: ignore[call-overload]
        digest.update(((", " if index else "") + encode(row)).encode())
    digest.update(f"]{after}".encode())
    return digest.hexdigest()


def entry_name(shown_source: str, material: dict[str, object]) -> str:
    """``<slug>-<24 hex>``: the slug says what it is, the digest of ``material`` which one."""
    digest = material_digest(material)[:24]
    slug = _SLUG_UNSAFE.sub("-", shown_source.lower()).strip("-.")[:48].rstrip("-.")
    return f"{slug or 'entry'}-{digest}"


def asset_material(
    where: str, revision: str | None, patterns: tuple[tuple[str, ...], ...]
) -> dict[str, object]:
    """What identifies one asset whatever its files: ``where`` (the source as shown, plus its
    endpoint), the resolved revision and the patterns. Its digest is an entry's ``identity``:
    the entries of one asset's versions share it."""
    return {"where": where, "revision": revision, "patterns": [list(p) for p in patterns]}


def key_material(asset: dict[str, object], files: Iterable[RemoteFile]) -> dict[str, object]:
    """What identifies one version of one asset: the asset (:func:`asset_material`) and every
    listed file's identity (in path order, read from the listing's table as it is hashed when
    the listing is on disk)."""
    return {**asset, "files": _identities(files)}


def _identities(files: Iterable[RemoteFile]) -> Iterable[list[object]]:
    """``[path, size, version, checksum]`` of each file, in path order."""
    if isinstance(files, FileTable):
        ordered = files.query(f"SELECT {COLUMNS} FROM {files.name} ORDER BY path, size")
        return (_identity(f) for f in ordered)
    return sorted(_identity(f) for f in files)


def _identity(file: RemoteFile) -> list[object]:
    return [file.path, file.size, file.version, str(file.checksum) if file.checksum else None]


@dataclass(frozen=True)
class EntryInfo:
    """One entry as ``initializer-cache ls`` shows it."""

    name: str
    source: str
    revision: str | None
    size: int  # bytes on disk, whether complete or not
    files: int
    complete: bool
    last_used: float
    held_by: str  # "" when free, else who holds it: "an initializer" or "a training"


class AssetCache:
    """The entries under one cache folder."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.entries_dir = root / ENTRIES

    # -- one entry, for an initializer ----------------------------------------------------------

    def lock(
        self,
        name: str,
        stop: threading.Event,
        shown: str,
        total: int,
        interval: float,
        shared: bool = False,
        stall_limit: float = 600.0,
    ) -> FileLock:
        """The entry's lock, whose wait logs what the holder has fetched so far; ``shared`` for
        the shards of one sharded fetch, which fill the entry together. The wait ends with
        exit 7 when the holder's bytes on disk stand still for ``stall_limit`` seconds."""
        entry = self.entries_dir / name

        def waiting() -> str:
            return (
                f"waiting for another initializer fetching {shown} into the cache "
                f"({name}: {human_bytes(disk_usage(entry))} of {human_bytes(total)} on disk)"
            )

        self._ensure_real_dir(self.entries_dir)
        return FileLock(
            self.entries_dir / f"{name}.lock",
            stop,
            waiting=waiting,
            interval=interval,
            shared=shared,
            stalled=(lambda: disk_usage(entry), stall_limit),
        )

    def prepare(self, name: str) -> Path:
        """The entry's folder, made safe to fetch into: a real folder, no symlink inside.

        Called with the entry's lock held. The engine rechecks every file against the manifest;
        what is removed here is what it must never follow: symlinks anyone planted.
        """
        entry = self.entries_dir / name
        self._ensure_real_dir(entry)
        readers = self.entries_dir / f"{name}.readers"  # made here: trainers may mount read-only
        try:
            os.close(os.open(readers, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW, 0o644))
        except OSError as exc:
            raise storage_error(exc, readers) from None
        _remove_symlinks(entry)
        return entry

    def record_use(
        self,
        name: str,
        source: str,
        revision: str | None,
        identity: str,
        totals: tuple[int, int] | None = None,
    ) -> None:
        """Note the entry's source (as shown, no secret), its asset's ``identity``, its
        ``totals`` (files, bytes: read from its manifest when not given), and that it was
        used now."""
        entry = self.entries_dir / name
        files, size = totals or manifest_totals(entry) or (0, 0)  # read a line at a time
        info = {
            "source": source,
            "revision": revision,
            "identity": identity,
            "files": files,
            "bytes": size,
            "last_used": time.time(),
        }
        try:
            atomic_write_bytes(entry / INFO_NAME, (json.dumps(info, indent=1) + "\n").encode())
        except OSError as exc:
            raise storage_error(exc, entry / INFO_NAME) from None

    def _ensure_real_dir(self, path: Path) -> None:
        """``path`` as a real folder: a symlink or file planted in its place is removed."""
        try:
            if path.is_symlink() or (path.exists() and not path.is_dir()):
                log.warning("cache: replacing %s, which is not a folder", path)
                path.unlink()
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise storage_error(exc, path) from None

    def latest(self, identity: str) -> tuple[str, int] | None:
        """The asset's most recently used entry, the version a TrainJob most likely asks for
        again: its name and the bytes it held then. Entries written before identities were
        recorded have none, and match nothing."""
        found: tuple[float, str, int] | None = None
        for entry in self._entry_dirs():
            info = _read_info(entry)
            used, size = info.get("last_used"), info.get("bytes")
            if info.get("identity") != identity or not isinstance(used, (int, float)):
                continue
            if found is None or used > found[0]:
                found = (used, entry.name, size if isinstance(size, int) else 0)
        return found[1:] if found else None

    # -- every entry, for ls and prune ----------------------------------------------------------

    def entries(self) -> list[EntryInfo]:
        """Every entry, complete or not, least recently used first."""
        found = [self._describe(path) for path in self._entry_dirs()]
        return sorted(found, key=lambda e: e.last_used)

    def _entry_dirs(self) -> list[Path]:
        with contextlib.suppress(FileNotFoundError):
            return [p for p in self.entries_dir.iterdir() if p.is_dir() and not p.is_symlink()]
        return []

    def _describe(self, entry: Path) -> EntryInfo:
        info = _read_info(entry)
        last_used = info.get("last_used")
        return EntryInfo(
            name=entry.name,
            source=str(info.get("source", "?")),
            revision=info.get("revision"),
            size=disk_usage(entry),
            files=int(info.get("files", 0)),
            complete=not find_problems(entry),
            last_used=last_used if isinstance(last_used, (int, float)) else entry.stat().st_mtime,
            held_by=self._holder(entry.name),
        )

    def _holder(self, name: str) -> str:
        lock = FileLock(self.entries_dir / f"{name}.lock")
        if not lock.try_acquire():
            return "an initializer"
        lock.release()
        readers = FileLock(self.entries_dir / f"{name}.readers")
        if not readers.try_acquire():
            return "a training"
        readers.release()
        return ""

    def remove(self, name: str) -> bool:
        """Delete one entry unless an initializer holds it; True when it is gone.

        The entry is moved into ``.trash`` while its lock is held, so no initializer can link
        a half-deleted tree, and the lock file goes with it: an initializer waiting on it then
        sees its lock file replaced and starts a fresh entry.
        """
        lock = FileLock(self.entries_dir / f"{name}.lock")
        if not lock.try_acquire():
            return False
        readers = FileLock(self.entries_dir / f"{name}.readers")
        try:
            if not readers.try_acquire():
                return False
            trash = self.root / TRASH
            self._ensure_real_dir(trash)
            doomed = trash / f"{name}.{secrets.token_hex(6)}"
            os.rename(self.entries_dir / name, doomed)
            lock.path.unlink(missing_ok=True)
            readers.path.unlink(missing_ok=True)
        finally:
            lock.release()
            readers.release()
        shutil.rmtree(doomed, ignore_errors=True)
        return True

    def empty_trash(self) -> None:
        """Finish deletions a killed prune left behind."""
        with contextlib.suppress(FileNotFoundError):
            for path in (self.root / TRASH).iterdir():
                shutil.rmtree(path, ignore_errors=True)


def _remove_symlinks(root: Path) -> None:
    """Remove every symlink under ``root``, following none. A listing gives each name's type
    (ext4, XFS, overlayfs): no ``stat`` per file, which a million files would feel."""
    folders = [os.fspath(root)]
    while folders:
        folder = folders.pop()
        try:
            with os.scandir(folder) as listed:
                for item in listed:
                    if item.is_symlink():
                        log.warning(
                            "cache: removing the symlink %s planted in the entry", item.path
                        )
                        os.unlink(item.path)
                    elif item.is_dir(follow_symlinks=False):
                        folders.append(item.path)
        except OSError as exc:
            raise storage_error(exc, Path(folder)) from None


def _read_info(entry: Path) -> dict[str, object]:
    """The entry's :data:`INFO_NAME` record; empty when it is missing or unreadable."""
    try:
        info = json.loads((entry / INFO_NAME).read_bytes())
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def to_prune(
    entries: list[EntryInfo], max_size: int | None, older_than: float | None, now: float
) -> list[EntryInfo]:
    """The entries to remove, least recently used first: those unused for ``older_than``
    seconds, then more until the rest fit in ``max_size``. Held entries are never chosen."""
    chosen: list[EntryInfo] = []
    kept = sum(e.size for e in entries)
    for entry in sorted(entries, key=lambda e: e.last_used):
        if entry.held_by:
            continue
        too_old = older_than is not None and now - entry.last_used > older_than
        too_big = max_size is not None and kept > max_size
        if too_old or too_big:
            chosen.append(entry)
            kept -= entry.size
    return chosen


def disk_usage(folder: Path) -> int:
    """Bytes the folder's files take on disk (sparse .part files count what is written)."""
    total = 0
    for root, _dirs, files in os.walk(folder):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
    return total


def expose(entry: Path, output: Path) -> None:
    """Make ``output`` a symlink to ``entry``, atomically (a reader sees the old or the new).

    A symlink rather than hard links: the cache and the workspace are usually different volumes,
    one link costs the same for 2 files or 2 million, and prune can reclaim the entry's space.
    """
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        if output.is_dir() and not output.is_symlink():
            if any(output.iterdir()):
                raise LocalStorageError(
                    f"{output} is a folder with files in it; with CACHE_DIR the output becomes "
                    "a link into the cache: empty or remove it, or choose another --output"
                )
            os.rmdir(output)
        elif output.exists() and not output.is_symlink():
            raise LocalStorageError(f"{output} is a file; remove it or choose another --output")
        temporary = output.with_name(f".{output.name}.initializer-link-{secrets.token_hex(6)}")
        temporary.unlink(missing_ok=True)
        os.symlink(entry, temporary)
        os.replace(temporary, output)
    except OSError as exc:
        if exc.errno == errno.EBUSY:
            raise LocalStorageError(
                f"{output} is a mount point, which cannot become a link into the cache; mount "
                "the volume at its parent folder (e.g. /workspace) instead"
            ) from None
        raise storage_error(exc, output) from None


def prove_read_access(source: Source, files: Iterable[RemoteFile], retry: RetryPolicy) -> None:
    """Check with the caller's credentials that they may read the smallest file's bytes.

    A listing is not enough: the Hub lists gated repos to everyone and refuses only the bytes,
    and S3 grants ListBucket apart from GetObject. Without this read, a complete entry would hand
    a caller the bytes the source refuses them. Raises the source's AuthError (exit 3).
    """
    smallest = min((f for f in files if f.size > 0), key=lambda f: f.size, default=None)
    if smallest is None:
        return  # no byte to refuse
    retry.call(lambda: source.check_access(smallest), f"checking read access to {smallest.path}")


def fetch_through_cache(
    cache: AssetCache,
    name: str,
    output: Path,
    fill: Callable[[Path], Outcome | None],
    *,
    shown: str,
    revision: str | None,
    identity: str,
    total: int,
    stop: threading.Event,
    interval: float,
    shared: bool = False,
    stall_limit: float = 600.0,
    existing: bool = False,
) -> Outcome | None:
    """Fill the entry ``name`` (``fill`` runs the engine into it; it does nothing when the entry
    is complete) under its lock, then link ``output`` to it, still under the lock, so prune can
    never remove an entry between its check and its link. A ``fill`` that gives None says the
    entry is not the one wanted: nothing is linked, and None is returned; so it is, with
    nothing made, for an ``existing`` entry found gone (pruned) once locked."""
    with cache.lock(name, stop, shown, total, interval, shared, stall_limit):
        if existing and not (cache.entries_dir / name).is_dir():
            return None
        entry = cache.prepare(name)
        log.info("cache: entry %s", entry)
        outcome = fill(entry)
        if outcome is None:
            return None
        totals = (outcome.files_total, outcome.bytes_total) if outcome.up_to_date else None
        cache.record_use(name, shown, revision, identity, totals)
        expose(entry, output)
    log.info("cache: %s links to %s", output, entry)
    return outcome

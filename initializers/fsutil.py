"""Small filesystem primitives: safe destination paths, atomic writes, durable renames."""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import re
import stat
from collections.abc import Callable, Iterable
from pathlib import Path

from initializers.errors import LocalStorageError

PART_SUFFIX = ".part"
JOURNAL_SUFFIX = ".part.journal"
# Longest single path component Linux filesystems accept, in bytes.
NAME_MAX = 255
_LONGEST = NAME_MAX - len(JOURNAL_SUFFIX) - 1  # a component, with room for ".NAME.part.journal"
_NAMELESS = frozenset(("", ".", ".."))


# Unicode's control characters (category Cc) are exactly these 65 code points; one search, not
# a category lookup per character (the 2,002-file dataset's listing spent ~15 ms there).
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


class UnsafePathError(ValueError):
    """A remote name that cannot be stored safely under the destination."""


def safe_relpath(name: str) -> str:
    """Normalise a remote key to a relative POSIX path, or raise UnsafePathError.

    Refuses anything that could escape the destination or that a filesystem cannot hold:
    ``..`` components, absolute paths, backslashes, control characters, over-long components,
    and our own temporary/manifest names.
    """
    if not name or name.endswith("/"):
        raise UnsafePathError("is empty or names a folder")
    if "\\" in name:
        raise UnsafePathError("contains a backslash")
    if _CONTROL.search(name):
        raise UnsafePathError("contains a control character")
    if name.startswith("/"):
        raise UnsafePathError("is absolute")
    parts = name.split("/")
    if not _NAMELESS.isdisjoint(parts):
        raise UnsafePathError("has '.', '..' or empty components")
    # A component can only be too long in a name that is (once per listed key: cheap first).
    if len(name.encode()) > _LONGEST and any(len(part.encode()) > _LONGEST for part in parts):
        raise UnsafePathError(
            f"has a component longer than {_LONGEST} bytes (the filesystem "
            f"allows {NAME_MAX}, less room for the temporary name)"
        )
    last = parts[-1]
    if last.startswith(".initializer") or last.endswith((PART_SUFFIX, JOURNAL_SUFFIX)):
        raise UnsafePathError("collides with the initializer's own bookkeeping names")
    return name


def part_path(final: Path) -> Path:
    """Hidden temporary name, in the same folder so the final rename is atomic."""
    return final.with_name(f".{final.name}{PART_SUFFIX}")


def journal_path(final: Path) -> Path:
    return final.with_name(f".{final.name}{JOURNAL_SUFFIX}")


def ensure_dir_inside(dest: Path, folder: Path, made: set[Path] | None = None) -> None:
    """Create ``folder`` (under ``dest``) without following a symlink planted on the way.

    Folders in ``made`` (this run's, checked already) are skipped, and those created or checked
    here are added: a dataset's 2,000 files in 120 folders then cost 120 ``mkdir`` calls, not
    one per file and ancestor."""
    if made is not None and folder in made:
        return
    rel = folder.relative_to(dest)
    current = dest
    for part in rel.parts:
        current = current / part
        if made is not None and current in made:
            continue
        try:
            os.mkdir(current)
        except FileExistsError:
            if current.is_symlink() or not current.is_dir():
                raise LocalStorageError(
                    f"{current} exists and is not a plain folder (a symlink or a file); "
                    "remove it or choose another --output"
                ) from None
        if made is not None:
            made.add(current)


def make_room_for(dest: Path, final: Path, made: set[Path] | None, where: str) -> None:
    """Get ``final``'s folder ready, and refuse a symlink or folder standing at ``final``
    (``where``: "the source", "the archive" — who has a file there)."""
    ensure_dir_inside(dest, final.parent, made)
    try:
        mode = os.lstat(final).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISLNK(mode) or stat.S_ISDIR(mode):
        raise LocalStorageError(
            f"{final} is a symlink or a folder where {where} has a file; remove it and rerun"
        )


def _load_sync_file_range() -> Callable[[int, int, int], None]:
    """Linux's sync_file_range(SYNC_FILE_RANGE_WRITE): queue writeback of a byte range without
    waiting for it, so the fsync before commit finds little left to do. A no-op elsewhere."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        call = libc.sync_file_range
    except (OSError, AttributeError):
        return lambda fd, offset, length: None
    call.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
    write = 2  # SYNC_FILE_RANGE_WRITE

    def start_writeback(fd: int, offset: int, length: int) -> None:
        call(fd, offset, length, write)  # advisory: a failure only means no head start

    return start_writeback


start_writeback = _load_sync_file_range()


# The most one ``pwrite`` hands the kernel. A write makes page-cache folios up to its own size,
# and a large folio needs a large free block: on a VM that reports freed memory to its host
# (``page_reporting``), those are the blocks the host took back, and each page then costs a host
# fault inside the copy. Measured with ``perf`` on the S3 model right after an s5cmd run (its
# 32 KiB writes leave small free blocks behind), samples in ``copy_folio_from_iter_atomic``:
# 1 MiB writes 6,690-7,198, 256 KiB 3,320-5,213, 128 KiB 1,015-2,359, 64 KiB 1,141-1,145,
# 32 KiB 1,188-1,213, s5cmd itself ~1,500; after a run of ours at 1 MiB, ~1,000 (its freed
# large blocks were not yet reported). 64 KiB is as low as any and costs ~0.03 CPU-s of
# interpreter more on 2 GiB than 1 MiB; an earlier sweep (9c4cbbb, urllib3 reads of 1 MiB)
# had found 1 MiB best, before ranges came in the native client's pieces.
WRITE_SIZE = 64 << 10
# Small files' pieces (~120 KiB, as the native client delivers them on the event loop) are
# written whole: their files make no folio larger than a piece, and a call more per piece is
# the loop thread's, which bounds those runs. Partial make bench at 97d9379, 5 rounds, the
# S3 dataset at 1 MiB against 64 KiB: 0.96x (0.87-0.99) the time, 0.95x with 20 ms latency.
PIECE_WRITE_SIZE = 1 << 20


def write_all(fd: int, view: memoryview, offset: int, most: int = WRITE_SIZE) -> None:
    """Write all of ``view`` at ``offset``, at most ``most`` bytes a call (``pwrite`` may also
    write less than asked)."""
    while view:
        written = os.pwrite(fd, view[:most], offset)
        view, offset = view[written:], offset + written


BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def boot_id() -> str:
    """This boot of the kernel: what an unsynced write may not outlive ("" where unknown,
    which no recorded boot matches, so unsynced files are then always checked again)."""
    try:
        return BOOT_ID.read_text().strip()
    except OSError:
        return ""


def fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(target: Path, data: bytes | Iterable[bytes]) -> None:
    """Write ``data`` (or its pieces, in order) to ``target`` so readers see the old file or
    the whole new one.

    Safe with concurrent writers (the shards of one cache entry record its use together): they
    take turns on one temporary name, locked while it is written and renamed. One fixed name
    means a write killed midway leaves no litter the next write does not reuse.
    """
    tmp = target.with_name(f".{target.name}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    while True:
        try:
            fd = os.open(tmp, flags, 0o644)
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.ENXIO):
                raise
            tmp.unlink(missing_ok=True)  # a planted symlink or pipe: never followed or waited on
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            state = _temporary_state(fd, tmp)
            if state == "ours":
                os.ftruncate(fd, 0)
                with open(fd, "wb", closefd=False) as out:
                    out.writelines([data] if isinstance(data, bytes) else data)
                os.fsync(fd)
                os.replace(tmp, target)
                break
            if state == "planted":
                tmp.unlink(missing_ok=True)
            # "renamed": the writer before us finished with it; start again on a new file
        finally:
            os.close(fd)
    fsync_dir(target.parent)


def _temporary_state(fd: int, path: Path) -> str:
    """``ours`` when ``path`` still names the open regular file ``fd`` and nothing else does,
    ``renamed`` when it no longer names it, ``planted`` for a device or a hard link to another
    file, which must be unlinked, never written through."""
    try:
        here = os.lstat(path)
    except FileNotFoundError:
        return "renamed"
    opened = os.fstat(fd)
    if (here.st_dev, here.st_ino) != (opened.st_dev, opened.st_ino):
        return "renamed"
    return "ours" if stat.S_ISREG(opened.st_mode) and opened.st_nlink == 1 else "planted"

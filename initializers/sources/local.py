"""file:// — a folder or one file on a mounted volume (a PVC, a hostPath), copied like a download.

The engine treats it as any other source: the same selection, verification, resume, group
commit and manifest. A file's version is its size and modification time: a rerun against an
unchanged folder does nothing, a file changed since the last run is copied again, and a file
that changes *while* it is copied fails the run (exit 5) instead of landing half old, half new.
A local file carries no digest of its own, so what is verified is its size and that it stayed
unchanged from the listing to the last byte read.

Symlinks to files are followed, as ``cp -L`` does (a Hugging Face cache snapshot is a folder of
such links); symlinks to folders are not entered (they can loop) and are reported as skipped.
The initializer's own bookkeeping files in the source (a folder an earlier run filled) are not
copied.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Self

from initializers.errors import AuthError, IntegrityError, NotFoundError, UsageError
from initializers.fsutil import (
    JOURNAL_SUFFIX,
    PART_SUFFIX,
    UnsafePathError,
    safe_relpath,
    write_all,
)
from initializers.options import SourceSettings
from initializers.sources.base import Listing, Order, RemoteFile, Skipped, Source
from initializers.sources.paging import paged_listing
from initializers.streams import RangeReader

log = logging.getLogger(__name__)

CHUNK_SIZE = 1 << 20
COPY_STEP = 4 << 20  # one kernel copy per step; the engine checks for a stop between steps
# copy_file_range refused: not across these filesystems, not on this one, or not here at all.
_NO_KERNEL_COPY = {errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EBADF}


class LocalSource(Source):
    """The regular files under ``file:///path`` (recursively), or that one file."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @classmethod
    def from_settings(cls, location: str, settings: SourceSettings) -> Self:
        if not location.startswith("/"):
            raise UsageError(
                f"file://{location}: the path must be absolute, as in file:///mnt/models/llama"
            )
        return cls(Path(os.path.normpath(location)))

    def describe(self) -> str:
        return f"file://{self.root}"

    def list(self) -> Listing:
        try:
            top = self.root.stat()
        except FileNotFoundError:
            raise NotFoundError(
                f"{self.describe()} does not exist; check the path and that the volume is mounted"
            ) from None
        except PermissionError:
            raise _unreadable(self.describe()) from None
        if stat.S_ISREG(top.st_mode):
            return Listing(None, [_remote(self.root.name, self.root, top)])
        if not stat.S_ISDIR(top.st_mode):
            raise UsageError(f"{self.describe()} is neither a folder nor a regular file")
        listing = paged_listing(None, self._entries(), Order.TREE)
        if not listing.files and not listing.skipped:
            raise NotFoundError(f"{self.describe()} is an empty folder; nothing to copy")
        return listing

    def _entries(self) -> Iterator[RemoteFile | Skipped]:
        """Every regular file below the root, or a name and why it is refused."""
        for relative, path, why in self._walk():
            if why:
                yield relative, why
                continue
            try:
                info = path.stat()
            except FileNotFoundError:
                yield relative, "is a dangling symlink"
                continue
            except PermissionError:
                raise _unreadable(f"{self.describe()}/{relative}") from None
            if not stat.S_ISREG(info.st_mode):
                yield relative, "is not a regular file"
                continue
            try:
                yield _remote(safe_relpath(relative), path, info)
            except UnsafePathError as exc:
                yield relative, str(exc)

    def _walk(self) -> Iterator[tuple[str, Path, str | None]]:
        """(relative name, path, why it is skipped or None) for every entry below the root."""

        def failed(exc: OSError) -> None:
            raise _unreadable(f"file://{exc.filename}")

        for folder, dirs, names in os.walk(self.root, onerror=failed):
            base = Path(folder)
            for name in list(dirs):
                if (base / name).is_symlink():
                    dirs.remove(name)
                    relative = (base / name).relative_to(self.root).as_posix()
                    yield relative, base / name, "is a symlink to a folder (not followed)"
            for name in names:
                if name.startswith(".initializer") or name.endswith((PART_SUFFIX, JOURNAL_SUFFIX)):
                    continue  # bookkeeping of a run that filled this folder
                yield (base / name).relative_to(self.root).as_posix(), base / name, None

    def open_range(self, file: RemoteFile, start: int, end: int) -> RangeReader:
        return LocalRangeReader(Path(file.locator), file, start, end)


def _remote(name: str, path: Path, info: os.stat_result) -> RemoteFile:
    return RemoteFile(name, info.st_size, _version(info), locator=str(path))


def _version(info: os.stat_result) -> str:
    return f"{info.st_size}-{info.st_mtime_ns}"


def _unreadable(what: str) -> AuthError:
    return AuthError(
        f"{what}: permission denied; give the initializer read access (fsGroup, "
        "runAsUser or the volume's permissions)"
    )


class LocalRangeReader(RangeReader):
    """Bytes ``[start, end)`` of a local file, checked unchanged since it was listed."""

    _buffers = threading.local()
    headers: Mapping[str, str] = MappingProxyType({})

    def __init__(self, path: Path, file: RemoteFile, start: int, end: int) -> None:
        self._file, self._start, self._end = file, start, end
        try:
            self._fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            raise NotFoundError(
                f"{file.path}: deleted from the source folder since it was listed; rerun"
            ) from None
        except PermissionError:
            raise _unreadable(file.path) from None
        self._check_unchanged()

    def _check_unchanged(self) -> None:
        if _version(os.fstat(self._fd)) != self._file.version:
            raise IntegrityError(
                f"{self._file.path}: changed in the source folder while it was being copied; "
                "rerun once it is no longer written to"
            )

    def chunks(self) -> Iterator[memoryview]:
        buffer = getattr(self._buffers, "view", None)
        if buffer is None:
            buffer = self._buffers.view = memoryview(bytearray(CHUNK_SIZE))
        position = self._start
        while position < self._end:
            count = os.preadv(self._fd, [buffer[: min(CHUNK_SIZE, self._end - position)]], position)
            if not count:
                break
            position += count
            yield buffer[:count]
        self._check_unchanged()
        if position < self._end:
            raise IntegrityError(f"{self._file.path}: shorter in the source folder than listed")

    def copy_into(self, fd: int, offset: int) -> Iterator[int]:
        """Copy the range into ``fd`` at ``offset`` inside the kernel, yielding each step's size.

        ``copy_file_range`` shares blocks where the filesystem can (XFS, Btrfs: a reflink) and
        copies without a trip through Python otherwise; where the kernel refuses it (another
        filesystem on an old kernel, a FUSE or NFS mount without it), pread/pwrite do the same.
        """
        position, target = self._start, offset
        kernel = True
        while position < self._end:
            step = min(COPY_STEP, self._end - position)
            if kernel:
                try:
                    count = os.copy_file_range(self._fd, fd, step, position, target)
                except OSError as exc:
                    if exc.errno not in _NO_KERNEL_COPY:
                        raise
                    kernel = False
                    continue
            else:
                data = os.pread(self._fd, min(step, CHUNK_SIZE), position)
                count = len(data)
                write_all(fd, memoryview(data), target)
            if not count:
                break
            position, target = position + count, target + count
            yield count
        self._check_unchanged()
        if position < self._end:
            raise IntegrityError(f"{self._file.path}: shorter in the source folder than listed")

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

"""The destination folder's own rules: who may write it (one lock), what failing to write means
(one message per errno), and which paths are really inside it."""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

from initializers.errors import Interrupted, LocalStorageError, UnavailableError

log = logging.getLogger(__name__)

LOCK_NAME = ".initializer.lock"


def storage_error(exc: OSError, what: Path | str) -> LocalStorageError:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return LocalStorageError(
            f"no space left on the volume while writing {what}; free space "
            "or use a bigger volume, then rerun (fetched bytes are kept)"
        )
    if exc.errno == errno.EROFS:
        return LocalStorageError(
            f"cannot write {what}: the volume is read-only; mount it read-write"
        )
    if exc.errno in (errno.EACCES, errno.EPERM):
        return LocalStorageError(
            f"cannot write {what}: {exc.strerror}; make the destination "
            "writable by this user (fsGroup / permissions)"
        )
    return LocalStorageError(f"cannot write {what}: {exc.strerror or exc}")


def inside(dest: Path, target: Path) -> bool:
    """True when ``target``'s folder is the folder it names under ``dest`` (no symlink on the
    way, no '..'), so deleting ``target`` cannot touch anything outside the destination."""
    real_dest = os.path.realpath(dest)
    expected = os.path.normpath(os.path.join(real_dest, target.relative_to(dest)))
    return expected.startswith(real_dest + os.sep) and (
        os.path.realpath(target.parent) == os.path.dirname(expected)
    )


class FileLock:
    """A flock on one lock file (exclusive unless ``shared``), waited for with a progress line,
    ended by a stop.

    After the lock is taken, the file must still be the one at ``path`` (same inode): a lock file
    that was removed or replaced while we waited (the cache's prune does that) locks nothing, so
    the wait starts again on the new file.
    """

    def __init__(
        self,
        path: Path,
        stop: threading.Event | None = None,
        *,
        waiting: Callable[[], str] | None = None,
        interval: float = 30.0,
        shared: bool = False,
        stalled: tuple[Callable[[], int], float] | None = None,
    ) -> None:
        self.path = path
        self._fd: int | None = None
        self._stop = stop or threading.Event()  # SIGTERM ends the wait too
        self._waiting = waiting or (
            lambda: f"another initializer is working on {path.parent}; waiting for it to finish"
        )
        self._interval = interval
        self._mode = fcntl.LOCK_SH if shared else fcntl.LOCK_EX  # shared: many holders at once
        # (how far the holder has got, seconds without progress after which waiting ends)
        self._stalled = stalled

    def try_acquire(self) -> bool:
        """Take the lock if it is free; False when someone holds it."""
        self._open()
        if self._take():
            return True
        self.release()
        return False

    def __enter__(self) -> FileLock:
        self._open()
        next_line = 0.0
        waited = 0.0
        watch = None  # made at the first wait: its first sample can walk a million files
        while not self._take():
            if watch is None and self._stalled:
                watch = _ProgressWatch(*self._stalled)
            if waited >= next_line:
                log.info("%s", self._waiting())
                next_line = waited + self._interval
            if watch is not None and watch.stalled(waited):
                self.release()
                raise UnavailableError(
                    f"{self._waiting()}: no progress for {watch.limit:g}s, so the holder seems "
                    "stuck (a node cut off with its lock?); rerun once it is gone"
                )
            if self._stop.wait(0.2):
                self.release()
                raise Interrupted(
                    "stopped by a signal while another initializer held the destination; "
                    "rerun to resume"
                ) from None
            waited += 0.2
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _open(self) -> None:
        try:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as exc:
            raise storage_error(exc, self.path) from None

    def _take(self) -> bool:
        """One non-blocking attempt; on a lock file replaced meanwhile, reopen and say False."""
        assert self._fd is not None
        try:
            fcntl.flock(self._fd, self._mode | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        try:
            current = os.stat(self.path, follow_symlinks=False).st_ino
        except FileNotFoundError:
            current = None
        if current == os.fstat(self._fd).st_ino:
            return True
        self.release()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._open()
        return False


class _ProgressWatch:
    """Whether a lock holder's progress (sampled every 2 s) stood still for ``limit`` seconds."""

    def __init__(self, progress: Callable[[], int], limit: float) -> None:
        self.progress = progress
        self.limit = limit
        self._last = progress()
        self._since = 0.0
        self._sampled = 0.0

    def stalled(self, waited: float) -> bool:
        if waited - self._sampled < 2:
            return False
        self._sampled = waited
        now = self.progress()
        if now != self._last:
            self._last, self._since = now, waited
        return waited - self._since >= self.limit


def destination_lock(dest: Path, stop: threading.Event | None = None) -> FileLock:
    """The lock that keeps two initializers from interleaving writes in one destination."""
    return FileLock(dest / LOCK_NAME, stop)

"""The destination folder's own rules: who may write it (one lock), what failing to write means
(one message per errno), and which paths are really inside it."""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import threading
from pathlib import Path

from initializers.errors import Interrupted, LocalStorageError

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


class DestinationLock:
    """An exclusive flock on the destination, so two initializers never interleave writes."""

    def __init__(self, dest: Path, stop: threading.Event | None = None) -> None:
        self._path = dest / LOCK_NAME
        self._fd: int | None = None
        self._stop = stop or threading.Event()  # SIGTERM ends the wait too

    def __enter__(self) -> DestinationLock:
        try:
            self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as exc:
            raise storage_error(exc, self._path) from None
        waited = 0.0
        while True:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except BlockingIOError:
                if waited % 30 == 0:
                    log.info(
                        "another initializer is working on %s; waiting for it to finish",
                        self._path.parent,
                    )
                if self._stop.wait(1):
                    self.__exit__()
                    raise Interrupted(
                        "stopped by a signal while another initializer held the destination; "
                        "rerun to resume"
                    ) from None
                waited += 1

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

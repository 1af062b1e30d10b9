"""Holding an asset store entry while a training reads it: all the launcher shims need of the
store (:mod:`initializers.cache` is the rest), so they load nothing of the fetching side."""

from __future__ import annotations

import fcntl
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

ENTRIES = "entries"  # the store's folder of entries, under CACHE_DIR


def hold_for_training(folder: Path) -> int | None:
    """When ``folder`` links to a cache entry: a shared lock on the entry's readers file, on a
    file descriptor that survives ``exec``, so prune leaves the entry alone while the training
    (the process the launcher shim becomes) runs. None for a plain folder."""
    if not folder.is_symlink():
        return None
    entry = Path(os.path.realpath(folder))
    readers = entry.parent / f"{entry.name}.readers"
    if entry.parent.name != ENTRIES or not readers.is_file():
        return None
    try:
        fd = os.open(readers, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)  # prune holds it alone only while it moves an entry away
    except OSError as exc:  # a filesystem without locks: hold nothing, say so
        log.warning("cannot hold %s (%s): prune may remove it meanwhile", entry, exc.strerror)
        os.close(fd)
        return None
    os.set_inheritable(fd, True)
    return fd

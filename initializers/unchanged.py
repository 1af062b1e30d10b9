"""The warm rerun's shortcut: prove, on every CPU at once, that a complete tree is unchanged.

A rerun over a complete destination whose source has not changed fetches nothing, yet the plan
(:mod:`initializers.planning`) passes each file through its scratch database on one thread:
~25 µs a file, 25 s for a million. Where the source can resume a listing at a key
(:meth:`~initializers.sources.base.Source.pages_after`: S3's ``start-after``, GCS's
``startOffset``), this check cuts the manifest (in path order, a record a line) into slices,
four for each process (one per usable CPU, at most four), and a thread per slice lists the
slice's key range from the record before it, a page at a time, while reading the slice's
records beside it: each listed file must be the next record, with the same version and size,
and lie on disk as recorded (size and mtime). The processes put every CPU to the parsing and
the comparing; the threads keep listing while a page is on its way. The first difference ends
the check everywhere (a byte the processes share) and the run plans as ever. The check only
ever proves there is nothing to do; it never decides what to fetch.

It applies only where the manifest alone speaks for the tree: it names this source and
revision, its files were synced or written since the last boot, no killed run left a commit
log, the destination is not a shard's part, and the listing is longer than a page.
"""

from __future__ import annotations

import logging
import mmap
import os
import threading
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from itertools import islice
from pathlib import Path
from typing import Any

from initializers import processes
from initializers.errors import STOPPED, InitializerError, Interrupted
from initializers.fsutil import boot_id
from initializers.manifest import (
    RecordRow,
    RecordSlice,
    read_manifest_head,
    record_slices,
    slice_rows,
)
from initializers.patterns import is_selected
from initializers.selection import SHOWN, Chooser
from initializers.sources.base import Listed, Source
from initializers.sources.prefix import is_placeholder

log = logging.getLogger(__name__)

# Key ranges a process lists at once, a thread each: a page of 1,000 keys costs ~8 ms of CPU
# here (its stats included), and a real store takes 20-100 ms to send it.
LISTINGS_PER_PROCESS = 4


@dataclass(frozen=True)
class Tally:
    """What a slice (or the whole tree) holds: files, bytes, and the keys the patterns left
    out (how many, and the first few)."""

    files: int = 0
    size: int = 0
    filtered: int = 0
    shown: tuple[str, ...] = ()

    def __add__(self, other: Tally) -> Tally:
        return Tally(
            self.files + other.files,
            self.size + other.size,
            self.filtered + other.filtered,
            (self.shown + other.shown)[:SHOWN],
        )


@dataclass(frozen=True)
class Check:
    """One check's fixed inputs, the same in every process."""

    source: Source
    dest: Path
    record: Path
    allow: tuple[str, ...]
    ignore: tuple[str, ...]
    stop: threading.Event
    label: str  # the run's name in the log
    workers: int  # requests the run may have in flight: the listings at once, at most


def unchanged(
    check: Check, chooser: Chooser, source_uri: str, revision: str | None
) -> Tally | None:
    """The tree's tally when it is proven to be exactly what the source lists now; None when
    it is not, or the check does not apply (the caller then plans as ever)."""
    head = read_manifest_head(check.record)
    if (
        chooser.listing.rest is None
        or head is None
        or (head.source, head.revision) != (source_uri, revision)
        or not head.trusted(boot_id())
        or check.source.pages_after(None) is None
    ):
        return None
    count = processes.process_count(processes.UNCOUNTED, check.workers)
    each = max(1, min(LISTINGS_PER_PROCESS, check.workers // count))
    slices = record_slices(check.record, count * each)
    if not slices:
        return None
    log.info(
        "%s: checking the complete tree against the source, %d key range(s) at once",
        check.label,
        len(slices),
    )
    differs = mmap.mmap(-1, 1)  # shared with the forked processes: 1 once one finds a change
    groups = [slices[i::count] for i in range(min(count, len(slices)))]
    children = [
        processes.fork(partial(_child, check, group, differs), check.stop) for group in groups[1:]
    ]
    try:
        mine = _group_tally(check, groups[0], differs)
    finally:
        if children:
            processes.gather(children, check.stop, lambda *_: None)
    tallies = [mine, *(_tally_of(child.result) for child in children)]
    if check.stop.is_set():
        raise Interrupted(STOPPED)
    total = _total(tallies)
    if total is None:
        log.info("%s: changed since the last complete run; planning what to fetch", check.label)
    return total


def _child(check: Check, group: list[RecordSlice], differs: mmap.mmap, _: Any) -> dict[str, Any]:
    return {"tally": _group_tally(check, group, differs)}


def _tally_of(result: dict[str, Any] | None) -> Tally | None:
    found = (result or {}).get("tally")
    return found if isinstance(found, Tally) else None


def _group_tally(check: Check, group: list[RecordSlice], differs: mmap.mmap) -> Tally | None:
    """This process's slices, each listed by a thread of its own: a listing mostly waits for
    its next page, and the others use the CPU meanwhile. The threads end before it returns."""
    with ThreadPoolExecutor(len(group), thread_name_prefix="unchanged") as pool:
        return _total(pool.map(partial(_slice_tally, check, differs=differs), group))


def _total(tallies: Iterable[Tally | None]) -> Tally | None:
    """The tallies added up; None if any is (a difference was found there)."""
    total = Tally()
    for tally in tallies:
        if tally is None:
            return None
        total += tally
    return total


def _slice_tally(check: Check, piece: RecordSlice, differs: mmap.mmap) -> Tally | None:
    """The slice's tally, or None at its first difference (which it tells the others)."""
    try:
        tally = _compare(check, piece, differs)
    except (InitializerError, ValueError, OSError) as exc:  # not proven; the plan will tell
        log.debug("the unchanged check gave up: %s", exc)
        tally = None
    if tally is None:
        differs[0] = 1
    return tally


def _compare(check: Check, piece: RecordSlice, differs: mmap.mmap) -> Tally | None:
    """Walk the slice's key range and its records side by side, a listed page at a time."""
    records = slice_rows(check.record, piece)
    pages = check.source.pages_after(piece.after)
    if pages is None:
        return None
    root, bound = os.fspath(check.dest), piece.bound
    files = size = filtered = 0
    shown: list[str] = []
    for page in pages:
        if check.stop.is_set():
            raise Interrupted(STOPPED)
        if differs[0]:
            return None
        last = bound is not None and bool(page) and page[-1][0] >= bound
        if last:
            page = [row for row in page if row[0] < bound]
        chosen, left_out = _chosen(page, check.allow, check.ignore)
        filtered += len(left_out)
        shown += left_out[: SHOWN - len(shown)]
        if not _same(root, chosen, islice(records, len(chosen))):
            return None
        files += len(chosen)
        size += sum(row[1] for row in chosen)
        if last:
            break
    if next(records, None) is not None:  # a recorded file is no longer listed
        return None
    return Tally(files, size, filtered, tuple(shown))


def _chosen(
    page: list[Listed], allow: tuple[str, ...], ignore: tuple[str, ...]
) -> tuple[list[Listed], list[str]]:
    """The page's files the run would fetch (not folder placeholders, chosen by the patterns),
    and the paths the patterns left out."""
    if not allow and not ignore and all(row[1] for row in page):  # no pattern, no empty key
        return page, []
    chosen: list[Listed] = []
    left_out: list[str] = []
    for row in page:
        if not is_placeholder(row[0], row[1]):
            if is_selected(row[0], allow, ignore):
                chosen.append(row)
            else:
                left_out.append(row[0])
    return chosen, left_out


def _same(root: str, listed: list[Listed], records: Iterable[RecordRow]) -> bool:
    """Each listed key is the next recorded file, unchanged at the source (path, size and
    version) and on disk (size and mtime: as :func:`~initializers.manifest.record_is_intact`
    asks, inline, as a million files pass here)."""
    count = 0
    for (path, size, version), row in zip(listed, records, strict=False):
        recorded, recorded_size, recorded_version, mtime_ns = row
        if path != recorded or size != recorded_size or version != recorded_version:
            return False
        try:
            st = os.stat(f"{root}/{path}", follow_symlinks=False)
        except OSError:
            return False
        if st.st_size != size or st.st_mtime_ns != mtime_ns:
            return False
        count += 1
    return count == len(listed)


def report(chooser: Chooser, tally: Tally) -> None:
    """Say what the patterns left out, as a planned run does."""
    chooser.filtered_count, chooser.filtered_out = tally.filtered, list(tally.shown)
    chooser.chosen = tally.files
    chooser.report()

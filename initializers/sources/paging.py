"""Listings read a page at a time: the first page now, the rest while the fetch already runs.

A source gives its listing as one stream of entries (files, and names it refuses), pulling
its pages from the server as the stream is read. :func:`paged_listing` reads the first page
into the listing's table at once; when there is more, the :class:`~.base.Listing` it returns
carries the rest as an iterator the engine drives a page at a time from a thread of its own.
Each page is retried on its own (a failure on page 700 does not list 699 pages again), so the
entries a stream has given are never given twice.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from itertools import chain, islice
from typing import TypeVar

from initializers.filetable import FileTable
from initializers.sources.base import Listing, Order, RemoteFile, Skipped

T = TypeVar("T")

PAGE = 1000  # entries a step of the listing adds (S3's, GCS's and Azure's page size)


def paged_listing(
    revision: str | None,
    entries: Iterable[RemoteFile | Skipped],
    order: Order,
    page: int = PAGE,
) -> Listing:
    """The listing of ``entries``: its first ``page`` read now, the rest on demand."""
    files, skipped = FileTable(), []
    stream = iter(entries)
    _fill(stream, page, files, skipped)
    following = next(stream, None)
    if following is None:
        files.flush()
        return Listing(revision, files, skipped)
    rest = _pages(chain([following], stream), page, files, skipped)
    return Listing(revision, files, skipped, rest, order)


def _fill(
    stream: Iterator[RemoteFile | Skipped], count: int, files: FileTable, skipped: list[Skipped]
) -> int:
    """Add up to ``count`` entries of ``stream``; how many there were."""
    added = 0
    for entry in stream:
        if isinstance(entry, RemoteFile):
            files.append(entry)
        else:
            skipped.append(entry)
        added += 1
        if added == count:
            break
    return added


def _pages(
    stream: Iterator[RemoteFile | Skipped], page: int, files: FileTable, skipped: list[Skipped]
) -> Iterator[int]:
    """Each step adds a page to ``files`` (committed, for readers of the table) and yields how
    many files are listed so far."""
    while _fill(stream, page, files, skipped):
        files.flush()
        yield len(files)


def resumable(
    make: Callable[[], Iterable[T]], call: Callable[[Callable[[], T | None]], T | None]
) -> Iterator[T]:
    """The entries of ``make()``, listed again after a transient failure (``call``: the source's
    retrying caller) from past those already given: for a source whose listing of a pinned
    revision always comes in the same order and whose pages cannot be asked for one at a time
    (the Hub's tree, paginated inside its client)."""
    given = 0
    stream: Iterator[T] | None = None

    def step() -> T | None:
        nonlocal stream
        if stream is None:
            stream = iter(make())
            for _ in islice(stream, given):
                pass
        try:
            return next(stream, None)
        except BaseException:
            stream = None  # the next attempt lists again
            raise

    while (entry := call(step)) is not None:
        given += 1
        yield entry

"""Listings read a page at a time: the first page now, the rest while the fetch already runs.

A source gives its listing as one stream of entries (files, and names it refuses), pulling
its pages from the server as the stream is read. :func:`paged_listing` reads the first page
into the listing's table at once; when there is more, the :class:`~.base.Listing` it returns
carries the rest as an iterator the engine drives a page at a time from a thread of its own.
Each page is retried on its own (a failure on page 700 does not list 699 pages again), so the
entries a stream has given are never given twice.

A source whose pages are no longer than :data:`PAGE` says where they end with :data:`PAGE_END`
between two pages (only when another follows: S3's ``IsTruncated``, GCS's ``nextPageToken``,
the Hub's next-page link). The first page then ends there, and the listing is known to go on
without asking for the next page: the peek one entry past a full first page cost one more
listing request before the first GET (a real endpoint's page takes 50-150 ms). Azure's pages
are 5,000 blobs: the first page's 1,000 entries are peeked past within it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from itertools import chain, islice
from typing import Any, Final, TypeVar

from initializers.filetable import FileTable
from initializers.sources.base import Listing, Order, RemoteFile, Skipped

T = TypeVar("T")

PAGE = 1000  # entries a step of the listing adds (S3's, GCS's and Azure's page size)


class PageEnd:
    """The type of :data:`PAGE_END`."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "PAGE_END"


PAGE_END: Final = PageEnd()  # between two pages of a stream: reading on asks for the next one

Entries = Iterable[RemoteFile | Skipped | PageEnd]


def paged_listing(
    revision: str | None, entries: Entries, order: Order, page: int = PAGE
) -> Listing:
    """The listing of ``entries``: its first page read now (up to ``page`` entries, or to the
    source's first page end), the rest on demand."""
    files, skipped = FileTable(), []
    stream = iter(entries)
    _, paused = _fill(stream, page, files, skipped)
    if not paused:  # not stopped at the first page's end, where the stream is known to go on
        following = next(stream, None)  # a stream without page ends: look one entry ahead
        if following is None:
            files.flush()
            return Listing(revision, files, skipped)
        if following is not PAGE_END:
            stream = chain([following], stream)
    rest = _pages(stream, page, files, skipped)
    return Listing(revision, files, skipped, rest, order)


def _fill(
    stream: Iterator[Any], count: int, files: FileTable, skipped: list[Skipped]
) -> tuple[int, bool]:
    """Add up to ``count`` entries of ``stream``, stopping early at a page's end once any were
    added: (how many were added, whether it stopped there, so the stream goes on)."""
    added = 0
    for entry in stream:
        if entry is PAGE_END:
            if added:
                return added, True
            continue
        if isinstance(entry, RemoteFile):
            files.append(entry)
        else:
            skipped.append(entry)
        added += 1
        if added == count:
            break
    return added, False


def _pages(
    stream: Iterator[Any], page: int, files: FileTable, skipped: list[Skipped]
) -> Iterator[int]:
    """Each step adds a page to ``files`` (committed, for readers of the table) and yields how
    many files are listed so far."""
    while _fill(stream, page, files, skipped)[0]:
        files.flush()
        yield len(files)


def split_pages(stream: Iterable[T | PageEnd]) -> Iterator[list[T]]:
    """A stream with :data:`PAGE_END` between its pages, a page at a time (each read in full
    before it is given, the next one only asked for when it is wanted)."""
    page: list[T] = []
    for entry in stream:
        if isinstance(entry, PageEnd):
            yield page
            page = []
        else:
            page.append(entry)
    yield page


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

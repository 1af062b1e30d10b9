"""The prefix rule every object store shares (S3, GCS, Azure Blob), written once.

A URI's path is a folder on a ``/`` boundary (``s3://b/model`` never pulls ``model-v2/``), or,
when no folder of that name exists, one object, landing under its own name. Zero-byte keys
ending in ``/`` are folder placeholders, not files; a key whose relative name is unsafe is
skipped with the reason.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from initializers.errors import NotFoundError, UsageError
from initializers.fsutil import UnsafePathError, safe_relpath
from initializers.retry import RetryPolicy
from initializers.sources.base import Listing, Order, RemoteFile, Skipped
from initializers.sources.paging import PAGE_END, PageEnd, paged_listing


def split_location(
    scheme: str, location: str, valid: re.Pattern[str], rule: str, noun: str = "bucket"
) -> tuple[str, str]:
    """``bucket/prefix`` → (bucket, prefix); a malformed name, or a bare bucket (a likely
    mistake: ``scheme://bucket/`` says "all of it"), is a UsageError naming the fix."""
    bucket, slash, prefix = location.partition("/")
    if not valid.match(bucket) or ".." in bucket:
        raise UsageError(f"{scheme}://{location}: {bucket!r} is not a valid {noun} name ({rule})")
    if not slash:
        raise UsageError(
            f"{scheme}://{bucket} names a whole {noun}; add a prefix "
            f"({scheme}://{bucket}/path) or write {scheme}://{bucket}/ to fetch all of it"
        )
    return bucket, prefix


@dataclass(frozen=True, slots=True)
class Entry:
    """One listed object: its full key, its size, and what the source needs to describe it."""

    key: str
    size: int
    meta: Any


def folder_of(prefix: str) -> str:
    """The folder a prefix names: its keys' common start ("" for a whole bucket)."""
    return prefix if prefix.endswith("/") or not prefix else prefix + "/"


def is_placeholder(key: str, size: int) -> bool:
    """A zero-byte key ending in ``/``: a folder placeholder, not a file."""
    return size == 0 and key.endswith("/")


def list_prefix(
    prefix: str,
    *,
    where: str,
    retry: RetryPolicy,
    list_folder: Callable[[str], Iterable[Entry | PageEnd]],
    lookup: Callable[[str], Entry | None],
    remote: Callable[[str, Entry], RemoteFile],
    nouns: tuple[str, str] = ("objects", "bucket"),
) -> Listing:
    """List ``prefix`` by the rule above; ``nouns`` name the objects and their container in the
    not-found message ("blobs", "container" for Azure).

    ``list_folder`` gives the entries as its pages arrive (each page retried on its own), with
    :data:`~initializers.sources.paging.PAGE_END` between two pages; the first page is read
    now, the rest as the engine asks (:mod:`initializers.sources.paging`)."""
    folder = folder_of(prefix)
    seen = [0]  # entries listed, folder placeholders included

    def entries() -> Iterator[RemoteFile | Skipped | PageEnd]:
        for entry in list_folder(folder):
            if entry is PAGE_END:
                yield entry
                continue
            seen[0] += 1
            if is_placeholder(entry.key, entry.size):
                continue
            try:
                yield remote(safe_relpath(entry.key[len(folder) :]), entry)
            except UnsafePathError as exc:
                yield entry.key, str(exc)

    listing = paged_listing(None, entries(), Order.KEYS)
    if not seen[0] and prefix and not prefix.endswith("/"):
        single = retry.call(lambda: lookup(prefix), prefix)
        if single is not None:
            return one_object(prefix, single, remote)
    if not seen[0]:
        things, container = nouns
        raise NotFoundError(
            f"no {things} under {where.rstrip('/')}/ — check the {container} and prefix "
            "(the prefix matches whole folder names)"
        )
    return listing


def one_object(key: str, entry: Entry, remote: Callable[[str, Entry], RemoteFile]) -> Listing:
    """The listing of the one object ``key`` names, under its own name (which must be as safe
    as any listed key's, else it is skipped)."""
    try:
        name = safe_relpath(key.rsplit("/", 1)[-1])
    except UnsafePathError as exc:
        return Listing(None, [], [(key, str(exc))])
    return Listing(None, [remote(name, entry)])

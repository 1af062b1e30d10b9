"""The choice of files made page by page: what is held back, and until when."""

from __future__ import annotations

import pytest

from initializers.errors import InitializerError
from initializers.filetable import FileTable
from initializers.selection import Chooser, Rules
from initializers.sources.base import Listing, Order, RemoteFile


def _listing(order: Order) -> tuple[Listing, FileTable]:
    table = FileTable()
    return Listing(None, table, rest=iter(()), order=order), table


def _page(table: FileTable, *paths: str) -> None:
    table.extend(RemoteFile(path, 1, "v") for path in paths)


def _chosen(chooser: Chooser, table: FileTable, done: bool = False) -> list[str]:
    rows = [seq for batch in chooser.take(done) for seq in batch]
    paths = dict(table.paths())
    return [paths[seq] for seq in rows]


def test_a_sorted_listing_releases_a_key_once_it_passes_the_key_followed_by_0():
    listing, table = _listing(Order.KEYS)
    chooser = Chooser(listing)
    _page(table, "a", "a-1.txt", "a.txt")
    # "a" may yet be a folder ("a/..." sorts before "a0"); the others are passed.
    assert _chosen(chooser, table) == ["a-1.txt"]
    _page(table, "a/b", "a0", "b")
    assert _chosen(chooser, table) == ["a.txt", "a/b", "a0"]
    assert _chosen(chooser, table, done=True) == ["b"]
    assert chooser.conflicts == ["a"]


def test_a_tree_listing_releases_every_file_at_once_and_the_patterns_still_apply():
    listing, table = _listing(Order.TREE)
    chooser = Chooser(listing, Rules(ignore=("*.tmp",)))
    _page(table, "z.bin", "a.tmp", "m/n.bin")
    assert _chosen(chooser, table) == ["z.bin", "m/n.bin"]
    assert chooser.filtered_count == 1


def test_a_listing_found_unsorted_before_anything_was_chosen_is_decided_when_complete():
    listing, table = _listing(Order.KEYS)
    chooser = Chooser(listing)
    _page(table, "b", "a", "a/x")
    assert _chosen(chooser, table) == []
    _page(table, "c")
    assert _chosen(chooser, table) == []
    assert _chosen(chooser, table, done=True) == ["b", "a/x", "c"]
    assert chooser.conflicts == ["a"]


def test_a_listing_found_unsorted_after_files_were_chosen_stops_with_one_line():
    listing, table = _listing(Order.KEYS)
    chooser = Chooser(listing)
    _page(table, "a", "b", "c")
    assert _chosen(chooser, table) == ["a", "b"]
    _page(table, "a2")
    with pytest.raises(InitializerError, match="out of key order"):
        _chosen(chooser, table)


@pytest.mark.parametrize("order", [Order.KEYS, Order.TREE])
def test_a_limited_take_looks_at_that_many_rows_and_the_next_take_goes_on_from_there(order):
    # The engine plans a first bite of a long first page before the processes fork; the
    # listing's thread then takes the rest of the page, and no row is taken twice or missed.
    listing, table = _listing(order)
    chooser = Chooser(listing)
    paths = [f"d/{i:04d}.bin" for i in range(1000)]
    _page(table, *paths)
    first = [seq for batch in chooser.take(False, limit=256) for seq in batch]
    assert 250 <= len(first) <= 256  # a sorted listing holds back the last keys it passed
    rest = _chosen(chooser, table) + _chosen(chooser, table, done=True)
    named = dict(table.paths())
    assert [named[seq] for seq in first] + rest == paths

"""Listings read a page at a time: the first page at once, the rest on demand, each entry once."""

from __future__ import annotations

from initializers.errors import TransientError
from initializers.retry import RetryPolicy
from initializers.sources.base import Order, RemoteFile
from initializers.sources.paging import paged_listing, resumable


def _files(count: int, pulled: list[int] | None = None):
    for i in range(count):
        if pulled is not None:
            pulled.append(i)
        yield RemoteFile(f"f{i:05d}", 1, "v")


def test_a_listing_of_one_page_is_read_whole_and_has_no_rest():
    listing = paged_listing(None, _files(1000), Order.KEYS, page=1000)
    assert listing.rest is None and len(listing.files) == 1000
    assert listing.order is Order.UNKNOWN  # whole: nothing is decided before it is complete


def test_a_longer_listing_reads_its_first_page_now_and_the_rest_a_page_per_step():
    pulled: list[int] = []
    listing = paged_listing(None, _files(2500, pulled), Order.KEYS, page=1000)
    assert len(listing.files) == 1000 and len(pulled) == 1001  # one entry looked ahead
    assert listing.rest is not None and listing.order is Order.KEYS
    assert next(listing.rest) == 2000
    assert len(pulled) == 2000  # no more than the page asked for
    listing.complete()
    assert listing.rest is None and len(listing.files) == 2500
    assert [f.path for f in listing.files] == [f"f{i:05d}" for i in range(2500)]


def test_refused_names_are_kept_beside_the_files_in_the_order_they_came():
    entries = [RemoteFile("a", 1, "v"), ("../b", "has '..'"), RemoteFile("c", 1, "v")]
    listing = paged_listing(None, entries, Order.TREE, page=1)
    listing.complete()
    assert [f.path for f in listing.files] == ["a", "c"]
    assert listing.skipped == [("../b", "has '..'")]


def test_a_listing_that_fails_midway_is_listed_again_past_what_it_gave_each_entry_once():
    attempts: list[int] = []

    def make():
        attempts.append(1)
        for i in range(10):
            if i == 6 and len(attempts) == 1:
                raise TransientError("the connection dropped on page 2")
            yield i

    retry = RetryPolicy(attempts=3, sleep=lambda _: None)
    given = list(resumable(make, lambda step: retry.call(step, "hf://org/repo")))
    assert given == list(range(10))
    assert len(attempts) == 2

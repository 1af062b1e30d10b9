"""Listings read a page at a time: the first page at once, the rest on demand, each entry once;
where the source marks its pages, the first page ends at its end, without asking for the next."""

from __future__ import annotations

import pytest

from initializers.config import AssetDefaults, load_settings
from initializers.errors import TransientError
from initializers.retry import RetryPolicy
from initializers.sources import open_source
from initializers.sources.base import Order, RemoteFile, Source
from initializers.sources.paging import PAGE_END, paged_listing, resumable
from tests.servers.hub import HubServer
from tests.servers.paged_s3 import PER_PAGE, Prefix, numbered_keys, paged_s3


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


def _marked(pages: list[int], pulled: list[object]):
    """Files in pages of the given sizes, PAGE_END between two pages, as a source that knows
    where its pages end gives them; ``pulled`` records what was read."""
    number = 0
    for i, size in enumerate(pages):
        if i:
            pulled.append(PAGE_END)
            yield PAGE_END
        for _ in range(size):
            pulled.append(number)
            yield RemoteFile(f"f{number:05d}", 1, "v")
            number += 1


def test_a_stream_that_marks_its_pages_is_read_to_its_first_page_end_and_no_further():
    pulled: list[object] = []
    listing = paged_listing(None, _marked([3, 3, 2], pulled), Order.KEYS, page=1000)
    assert len(listing.files) == 3 and pulled == [0, 1, 2, PAGE_END]  # page 2 not asked for
    assert listing.rest is not None and listing.order is Order.KEYS
    assert next(listing.rest) == 6 and pulled[-2:] == [5, PAGE_END]  # a step is a page
    listing.complete()
    assert [f.path for f in listing.files] == [f"f{i:05d}" for i in range(8)]


def test_a_marked_page_end_met_at_the_page_size_says_more_follow_without_reading_on():
    pulled: list[object] = []
    listing = paged_listing(None, _marked([3, 2], pulled), Order.KEYS, page=3)
    assert len(listing.files) == 3 and pulled == [0, 1, 2, PAGE_END]
    assert listing.rest is not None
    listing.complete()
    assert len(listing.files) == 5


def test_a_first_page_with_nothing_kept_does_not_end_the_first_page():
    pulled: list[object] = []
    listing = paged_listing(None, _marked([0, 0, 2, 4], pulled), Order.KEYS, page=1000)
    assert len(listing.files) == 2 and listing.rest is not None
    listing.complete()
    assert len(listing.files) == 6


def test_a_marked_stream_of_one_page_is_listed_whole():
    listing = paged_listing(None, _marked([4], []), Order.KEYS, page=1000)
    assert listing.rest is None and len(listing.files) == 4


def _s3_source(plane: str, endpoint: str, tmp_path, monkeypatch) -> Source:
    """``s3://bucket/d`` at ``endpoint``, over the signed REST plane or botocore's."""
    arguments = ["--storage-uri", "s3://bucket/d", "--region", "us-east-1"]
    if plane == "botocore":  # keys from a credentials file take botocore's control plane
        keys = tmp_path / "credentials"
        keys.write_text("[default]\naws_access_key_id = AK\naws_secret_access_key = SK\n")
        monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(keys))
        monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    else:
        arguments.append("--anonymous")
    settings = load_settings(
        AssetDefaults("dataset", tmp_path), [*arguments, "--endpoint", endpoint], env={}
    )
    return open_source(settings)


@pytest.mark.parametrize("plane", ["signed-rest", "botocore"])
def test_an_s3_listing_of_many_pages_returns_after_its_first_without_asking_for_the_second(
    plane, tmp_path, monkeypatch
):
    prefix = Prefix(numbered_keys(1500))  # 300 pages of 5 keys
    with paged_s3(prefix) as endpoint:
        source = _s3_source(plane, endpoint, tmp_path, monkeypatch)
        assert type(source._plane).__name__ == {"botocore": "BotocorePlane"}.get(plane, "RestPlane")
        listing = source.list()
        assert dict(prefix.requests) == {0: 1} and len(listing.files) == PER_PAGE
        listing.complete()
    assert set(prefix.requests.values()) == {1} and len(prefix.requests) == 300
    assert [f.locator for f in listing.files] == prefix.keys


@pytest.mark.parametrize("plane", ["signed-rest", "botocore"])
def test_an_s3_listing_resumed_past_a_key_comes_a_page_at_a_time_as_the_plan_lists_it(
    plane, tmp_path, monkeypatch
):
    """What the warm rerun's check compares (``Source.pages_after``): rows of (path, size,
    version) exactly as the plan's listing gives them, a server page at a time, each page asked
    for once and only when wanted, from past the key it is given."""
    prefix = Prefix(numbered_keys(1500))  # 300 pages of 5
    with paged_s3(prefix) as endpoint:
        source = _s3_source(plane, endpoint, tmp_path, monkeypatch)
        listing = source.list()
        listing.complete()
        planned = [(f.path, f.size, f.version) for f in listing.files]
        prefix.requests.clear()
        pages = source.pages_after(None)
        assert pages is not None
        first = next(pages)
        assert dict(prefix.requests) == {0: 1} and first == planned[:PER_PAGE]
        assert [first, *pages] == [planned[i : i + PER_PAGE] for i in range(0, 1500, PER_PAGE)]
        resumed = source.pages_after(planned[702][0])
        assert resumed is not None
        assert [row for page in resumed for row in page] == planned[703:]
    assert prefix.starts_after == [f"d/{planned[702][0]}"]


def test_a_hub_tree_of_many_pages_returns_after_its_first_page_without_asking_for_the_second(
    tmp_path,
):
    files = {f"data/{i // 10}/{i:03d}.txt": f"row {i}\n".encode() for i in range(40)}
    with HubServer(tree_page_size=7) as hub:  # folders take places on the pages too
        hub.add_repo("org/rows", files, repo_type="dataset")
        settings = load_settings(
            AssetDefaults("dataset", tmp_path),
            ["--storage-uri", "hf://datasets/org/rows"],
            env={"HF_ENDPOINT": hub.endpoint},
        )
        listing = open_source(settings).list()
        assert len(hub.find_requests(path_contains="/tree/")) == 1
        assert 0 < len(listing.files) < 7 and listing.rest is not None
        listing.complete()
        pages = len(hub.find_requests(path_contains="/tree/"))
    assert sorted(f.path for f in listing.files) == sorted(files)
    assert pages == -(-(40 + 5) // 7)  # 40 files and 5 folders, each page asked for once

"""A later TrainJob links the asset store's entry once key ranges, listed in parallel, prove it
unchanged: no whole listing to name the entry, no plan of its files.

A listing of more than a page named its entry only once complete: a million keys listed one
page after another, then every file planned, before the link (51-53 s for a million). Where
the source resumes a listing past a key (S3's ``start-after``), the asset's most recently used
entry is checked as a warm rerun checks its folder (:mod:`initializers.unchanged`) and linked
when nothing differs. These specs pin that the shortcut only ever links the entry the whole
listing would name: any difference at the source or in the entry sends the run the usual way,
a caller refused the bytes gets no link, and entries written before the shortcut still serve.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from initializers.cache import (
    INFO_NAME,
    AssetCache,
    asset_material,
    entry_name,
    fetch_through_cache,
    key_material,
)
from initializers.manifest import find_problems
from initializers.sources.base import RemoteFile
from initializers.unchanged import LISTINGS_PER_PROCESS
from tests.servers.paged_s3 import Prefix, env_for, holds_bodies, numbered_keys

KEYS = numbered_keys(1500)  # 300 pages of 5
CHECKED = "checking the complete tree against the source"
WHOLE = "cache: listing s3://bucket/d whole to name the entry it needs"


@dataclass
class Later:
    """A later TrainJob's world: the source of ``KEYS`` and the cache; :meth:`run` starts
    TrainJob ``n``'s initializer over them."""

    prefix: Prefix
    cache: Path
    endpoint: str
    tmp_path: Path
    run_initializer: Callable[..., Any]

    def entries(self) -> list[Path]:
        return sorted(p for p in (self.cache / "entries").iterdir() if p.is_dir())

    def workspace(self, n: int) -> Path:
        return self.tmp_path / f"trainjob-{n}" / "dataset"

    def run(self, n: int, **env: str) -> Any:
        return self.run_initializer(
            "dataset",
            env=env_for(self.endpoint, self.workspace(n), CACHE_DIR=str(self.cache), **env),
        )


@pytest.fixture
def later(paged, run_initializer, tmp_path) -> Later:
    """A cache whose one entry holds ``KEYS``, filled by a first TrainJob; the source's
    counters start afresh after it."""
    prefix = Prefix(list(KEYS))
    world = Later(prefix, tmp_path / "cache", paged(prefix), tmp_path, run_initializer)
    first = world.run(1)
    assert first.code == 0, first.stderr
    prefix.requests.clear()
    prefix.gets.clear()
    prefix.heads.clear()
    return world


def test_a_later_trainjob_links_the_entry_once_its_key_ranges_prove_it_unchanged(later):
    second = later.run(2)

    assert second.code == 0, second.stderr
    assert f"{CHECKED}, " in second.stderr and "already complete (1500 files" in second.stderr
    prefix = later.prefix
    assert not prefix.gets and sum(prefix.heads.values()) == 1  # the caller may read the bytes
    # The first page, then each key range once (a page or two more where ranges meet): the
    # entry was not named by a whole listing first, which would list the 300 pages again.
    ranges = len(prefix.starts_after) + 1
    assert 1 < ranges <= (os.cpu_count() or 1) * LISTINGS_PER_PROCESS
    assert sum(prefix.requests.values()) <= 1 + 300 + 2 * ranges
    [entry] = later.entries()
    assert later.workspace(2).resolve() == entry
    assert holds_bodies(later.workspace(2), KEYS) and find_problems(entry) == []
    assert json.loads((entry / INFO_NAME).read_text())["files"] == 1500


def test_a_changed_object_gets_a_new_entry_named_by_the_whole_listing_and_the_old_one_stays(
    later,
):
    later.prefix.etags[KEYS[777]] = "v2"
    second = later.run(2)

    assert second.code == 0, second.stderr
    assert WHOLE in second.stderr
    [new] = [e for e in later.entries() if e == later.workspace(2).resolve()]
    [old] = [e for e in later.entries() if e != new]
    assert len(later.prefix.gets) == 1500  # a new entry is fetched whole
    assert find_problems(old) == [] and find_problems(new) == []
    assert holds_bodies(new, KEYS)


def test_a_caller_refused_the_bytes_gets_exit_3_and_no_link_though_the_entry_is_unchanged(later):
    later.prefix.refuses_objects = True
    refused = later.run(2)

    assert refused.code == 3, refused.stderr
    assert not later.workspace(2).exists() and not later.workspace(2).is_symlink()
    assert CHECKED not in refused.stderr  # refused before the entry was looked at


@pytest.mark.parametrize("damage", ["truncated", "removed", "replaced by a symlink"])
def test_a_file_damaged_in_the_entry_is_fetched_again_into_the_same_entry(damage, later):
    [entry] = later.entries()
    victim = entry / KEYS[1000].removeprefix("d/")
    victim.unlink()
    if damage == "truncated":
        victim.write_bytes(b"")
    elif damage == "replaced by a symlink":
        outside = later.tmp_path / "outside"
        outside.write_bytes(b"keep me")
        victim.symlink_to(outside)
    second = later.run(2)

    assert second.code == 0, second.stderr
    assert WHOLE in second.stderr
    assert dict(later.prefix.gets) == {KEYS[1000]: 1}
    assert later.entries() == [entry] and later.workspace(2).resolve() == entry
    assert holds_bodies(entry, KEYS) and find_problems(entry) == []
    if damage == "replaced by a symlink":
        assert (later.tmp_path / "outside").read_bytes() == b"keep me"


def test_a_symlink_planted_beside_the_files_is_removed_and_the_entry_still_linked_unplanned(
    later,
):
    [entry] = later.entries()
    outside = later.tmp_path / "outside"
    outside.mkdir()
    (entry / "000" / "planted").symlink_to(outside)
    second = later.run(2)

    assert second.code == 0, second.stderr
    assert "removing the symlink" in second.stderr and WHOLE not in second.stderr
    assert not (entry / "000" / "planted").is_symlink() and outside.is_dir()
    assert not later.prefix.gets and later.workspace(2).resolve() == entry


def test_an_entry_from_before_identities_were_recorded_is_named_whole_once_then_checked_fast(
    later,
):
    [entry] = later.entries()
    info = json.loads((entry / INFO_NAME).read_text())
    del info["identity"]  # as a release before this one wrote it
    (entry / INFO_NAME).write_text(json.dumps(info))

    second = later.run(2)
    assert second.code == 0, second.stderr
    assert CHECKED not in second.stderr and "already complete (1500 files" in second.stderr
    assert later.workspace(2).resolve() == entry and not later.prefix.gets

    third = later.run(3)
    assert third.code == 0, third.stderr
    assert f"{CHECKED}, " in third.stderr and later.workspace(3).resolve() == entry
    assert not later.prefix.gets


def test_an_entry_keeps_the_name_earlier_releases_gave_it():
    """Named apart from its files now (an asset's identity, then its files' own), an entry's
    name must not move: a cache filled by an earlier release is found again, not fetched anew.
    The name below is the one 816733e computed."""
    files = [RemoteFile("b/c.txt", 3, "e2"), RemoteFile("a.bin", 10, '"etag"')]
    asset = asset_material("s3://bucket/d http://127.0.0.1:9000", "abc", (("*.bin",), (), ()))
    name = entry_name("s3://bucket/d", key_material(asset, files))
    assert name == "s3-bucket-d-edf5138281d9da635be03055"


def test_an_entry_pruned_between_its_choice_and_its_lock_is_not_made_again(tmp_path):
    cache = AssetCache(tmp_path / "cache")
    linked = fetch_through_cache(
        cache,
        "s3-bucket-d-pruned",
        tmp_path / "out",
        lambda entry: pytest.fail(f"{entry} was made to be checked"),
        shown="s3://bucket/d",
        revision=None,
        identity="the asset",
        total=0,
        stop=threading.Event(),
        interval=60,
        existing=True,
    )
    assert linked is None
    assert not (cache.entries_dir / "s3-bucket-d-pruned").exists()
    assert not (tmp_path / "out").exists() and not (tmp_path / "out").is_symlink()

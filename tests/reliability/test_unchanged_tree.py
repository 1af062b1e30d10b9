"""A warm rerun proves a complete tree unchanged by listing key ranges in parallel.

Where the source can resume a listing past a key (S3's ``start-after``), a rerun over a complete
destination cuts its manifest into a slice per CPU and checks each slice's key range in a
process of its own. These specs pin that the shortcut only ever says "nothing to do" when that
is true: any change at the source or on disk, wherever it falls (at a slice's edge included),
sends the run to its plan, which fetches exactly what changed; a tree a crash may have emptied
is never vouched for by size and mtime; a server that ignores ``start-after`` still gets a
correct rerun; a stop during the check ends every process at once.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from initializers import processes
from initializers.manifest import (
    FileRecord,
    Manifest,
    find_problems,
    record_slices,
    slice_rows,
    write_manifest_file,
)
from initializers.sources import s3pages
from initializers.unchanged import LISTINGS_PER_PROCESS
from tests.conftest import clean_env
from tests.reliability.test_processes import wait_until_gone
from tests.servers.paged_s3 import Prefix, env_for, holds_bodies, numbered_keys, paged_s3
from tests.test_s3_pages import pages_handed_to_element_tree
from tests.test_s3_pages import reader as reader_of

MANIFEST = ".initializer-manifest.json"
KEYS = numbered_keys(1500)  # 300 pages of 5
PROCESSES = processes.process_count(processes.UNCOUNTED, processes.MAX_PROCESSES)
SLICES = PROCESSES * LISTINGS_PER_PROCESS


@pytest.fixture(scope="module")
def complete_tree(tmp_path_factory) -> Path:
    """A tree of ``KEYS`` fetched once from the paged server; each test reruns over a copy."""
    made = tmp_path_factory.mktemp("complete") / "out"
    home = made.parent / "home"
    home.mkdir()
    with paged_s3(Prefix(KEYS)) as endpoint:
        first = subprocess.run(
            [sys.executable, "-m", "initializers.dataset"],
            env=clean_env(home, **env_for(endpoint, made)),
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert first.returncode == 0, first.stderr
    return made


def _complete(paged, complete_tree: Path, tmp_path: Path, reader: str = "pattern"):
    """A fresh server of ``KEYS`` and a copy of their complete tree: ``(prefix, endpoint, out)``;
    ``reader``: how the check is to read the server's pages (``"ElementTree"``: laid out so the
    pattern of :mod:`initializers.sources.s3pages` cannot)."""
    out = tmp_path / "out"
    shutil.copytree(complete_tree, out)  # mtimes kept: the manifest still vouches for each file
    prefix = Prefix(list(KEYS))
    prefix.aws_layout = reader == "pattern"
    return prefix, paged(prefix), out


READERS = ["pattern", "ElementTree"]


@pytest.mark.parametrize("reader", READERS)
def test_the_servers_layout_gives_the_check_the_reader_each_spec_names(reader, monkeypatch):
    prefix = Prefix(KEYS[:7])
    prefix.aws_layout = reader == "pattern"
    fallbacks = pages_handed_to_element_tree(monkeypatch)
    with paged_s3(prefix) as endpoint:
        body = urllib.request.urlopen(f"{endpoint}/bucket?list-type=2&prefix=d/").read()
    assert [row[0] for row in s3pages.key_page("d/", body).entries] == [k[2:] for k in KEYS[:5]]
    assert reader_of(fallbacks) == reader


def _rerun(run_initializer, endpoint: str, out: Path, **env: str) -> str:
    again = run_initializer("dataset", env=env_for(endpoint, out, **env))
    assert again.code == 0, again.stderr
    assert "Traceback" not in again.stderr
    return again.stderr


def _bounds(out: Path) -> list[str]:
    """The keys where the manifest's slices meet."""
    slices = record_slices(out / MANIFEST, SLICES) or []
    return [f"d/{piece.bound}" for piece in slices if piece.bound is not None]


def _before(key: str) -> str:
    return KEYS[KEYS.index(key) - 1]


POSITIONS = {
    "the first key": lambda bounds: [KEYS[0]],
    "a key in the middle of a slice": lambda bounds: [KEYS[777]],
    "the last key": lambda bounds: [KEYS[-1]],
    "each slice's first key": lambda bounds: bounds,
    "each slice's last key": lambda bounds: [_before(bound) for bound in bounds],
}


def _at(position: str, out: Path) -> list[str]:
    keys = POSITIONS[position](_bounds(out))
    assert keys, "no edge between slices"
    return keys


@pytest.mark.parametrize("reader", READERS)
def test_a_rerun_with_nothing_changed_lists_each_slice_once_from_its_edge_and_fetches_nothing(
    reader, paged, complete_tree, run_initializer, tmp_path
):
    prefix, endpoint, out = _complete(paged, complete_tree, tmp_path, reader)
    bounds = _bounds(out)
    assert len(bounds) == SLICES - 1

    said = _rerun(run_initializer, endpoint, out)
    assert f"checking the complete tree against the source, {SLICES} key range(s)" in said
    assert "already complete (1500 files" in said and "changed since" not in said
    assert not prefix.gets
    # Each slice after the first listed from the record just before its first one...
    assert sorted(prefix.starts_after) == [_before(bound) for bound in bounds]
    # ...and the run did not plan after the check: the one page it lists before the check
    # (the server says more follow), then the check's, each page once but for at most two at
    # each edge. A plan would list the 299 pages past the first.
    assert 1 + 300 <= sum(prefix.requests.values()) <= 1 + 300 + 2 * len(bounds)
    assert find_problems(out) == []


def test_the_check_lists_no_more_key_ranges_at_once_than_the_run_may_have_requests(
    paged, complete_tree, run_initializer, tmp_path
):
    prefix, endpoint, out = _complete(paged, complete_tree, tmp_path)
    said = _rerun(run_initializer, endpoint, out, WORKERS="1")
    assert "checking the complete tree against the source, 1 key range(s) at once" in said
    assert "already complete (1500 files" in said
    assert not prefix.starts_after and not prefix.gets


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("position", POSITIONS)
def test_a_rerun_after_objects_changed_at_the_source_fetches_those_only(
    position, reader, paged, complete_tree, run_initializer, tmp_path
):
    prefix, endpoint, out = _complete(paged, complete_tree, tmp_path, reader)
    changed = _at(position, out)
    for key in changed:
        prefix.etags[key] = "v2"  # not an MD5: nothing to check the same bytes against

    said = _rerun(run_initializer, endpoint, out)
    assert "changed since the last complete run; planning what to fetch" in said
    assert set(prefix.gets) == set(changed) and set(prefix.gets.values()) == {1}
    assert f"done — {len(changed)} fetched" in said
    assert holds_bodies(out, prefix.keys) and find_problems(out) == []


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("position", POSITIONS)
def test_a_rerun_after_objects_were_removed_removes_their_files_and_fetches_nothing(
    position, reader, paged, complete_tree, run_initializer, tmp_path
):
    prefix, endpoint, out = _complete(paged, complete_tree, tmp_path, reader)
    removed = _at(position, out)
    prefix.keys = [key for key in prefix.keys if key not in removed]

    said = _rerun(run_initializer, endpoint, out)
    assert f"removed {len(removed)} file(s) no longer in the source" in said
    assert not prefix.gets
    assert not any((out / key.removeprefix("d/")).exists() for key in removed)
    assert holds_bodies(out, prefix.keys) and find_problems(out) == []


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("position", POSITIONS)
def test_keys_added_next_to_objects_anywhere_are_fetched_by_the_rerun(
    position, reader, paged, complete_tree, run_initializer, tmp_path
):
    """Just before and just after each key of the position (a slice lists from the record
    before its first one: a key added there falls between two slices)."""
    prefix, endpoint, out = _complete(paged, complete_tree, tmp_path, reader)
    beside = _at(position, out)
    added = [f"{key[:-4]}-before.txt" for key in beside] + [f"{key}-after" for key in beside]
    prefix.keys = sorted({*prefix.keys, *added})

    said = _rerun(run_initializer, endpoint, out)
    assert set(prefix.gets) == set(added) and set(prefix.gets.values()) == {1}
    assert f"done — {len(set(added))} fetched, 1500 already present" in said
    assert holds_bodies(out, prefix.keys) and find_problems(out) == []


@pytest.mark.parametrize("position", POSITIONS)
def test_files_changed_on_disk_behind_the_manifest_are_fetched_again(
    position, paged, complete_tree, run_initializer, tmp_path
):
    prefix, endpoint, out = _complete(paged, complete_tree, tmp_path)
    changed = _at(position, out)
    for i, key in enumerate(changed):
        local = out / key.removeprefix("d/")
        if i % 3 == 0:
            local.write_bytes(b"")
        elif i % 3 == 1:
            os.utime(local, ns=(1, 1))
        else:
            local.unlink()

    said = _rerun(run_initializer, endpoint, out)
    assert set(prefix.gets) == set(changed)
    assert f"done — {len(changed)} fetched, {1500 - len(changed)} already present" in said
    assert holds_bodies(out, prefix.keys) and find_problems(out) == []


def test_a_tree_written_unsynced_before_the_last_boot_is_checked_by_its_bytes_not_vouched_for(
    paged, complete_tree, run_initializer, tmp_path
):
    prefix, endpoint, out = _complete(paged, complete_tree, tmp_path)
    zeroed = out / prefix.keys[1000].removeprefix("d/")
    info = zeroed.stat()
    zeroed.write_bytes(b"\0" * info.st_size)  # a crash's work: name, size and mtime kept
    os.utime(zeroed, ns=(info.st_atime_ns, info.st_mtime_ns))
    manifest = out / MANIFEST
    head, rest = manifest.read_text().split("\n", 1)
    boot = head.split('"boot_id": "', 1)[1].split('"', 1)[0]
    manifest.write_text(head.replace(boot, "an-earlier-boot") + "\n" + rest)

    said = _rerun(run_initializer, endpoint, out)
    assert set(prefix.gets) == {prefix.keys[1000]}
    assert "1500 file(s) were written unsynced before the last boot" in said
    assert holds_bodies(out, prefix.keys) and find_problems(out) == []


def test_a_server_that_ignores_start_after_still_gets_a_correct_rerun(
    paged, complete_tree, run_initializer, tmp_path
):
    prefix, endpoint, out = _complete(paged, complete_tree, tmp_path)
    prefix.honours_start_after = False

    assert "already complete (1500 files" in _rerun(run_initializer, endpoint, out)
    assert not prefix.gets
    prefix.keys.remove(prefix.keys[10])
    assert "removed 1 file(s) no longer in the source" in _rerun(run_initializer, endpoint, out)
    assert not prefix.gets and find_problems(out) == []


def test_a_rerun_with_patterns_proves_the_chosen_files_unchanged_and_says_what_they_left_out(
    paged, run_initializer, tmp_path
):
    prefix = Prefix(list(KEYS))
    endpoint, out = paged(prefix), tmp_path / "out"
    first = run_initializer("dataset", env=env_for(endpoint, out, IGNORE_PATTERNS="003/*,*7.txt"))
    assert first.code == 0, first.stderr
    prefix.gets.clear()
    prefix.requests.clear()
    said = _rerun(run_initializer, endpoint, out, IGNORE_PATTERNS="003/*,*7.txt")
    assert not prefix.gets
    assert "already complete (1260 files" in said
    assert "240 file(s) left out by the allow/ignore patterns" in said
    assert sum(prefix.requests.values()) <= 1 + 300 + 2 * len(_bounds(out)), "planned"


def test_sigterm_during_the_check_exits_143_at_once_and_leaves_no_process(
    paged, complete_tree, run_initializer, launch, tmp_path
):
    prefix, endpoint, out = _complete(paged, complete_tree, tmp_path)
    # Past the first 1,000 keys (well past the page the run lists before it begins the
    # check), slow pages: the slice that lists them takes a minute.
    prefix.slow_from, prefix.page_seconds = prefix.keys[1000], 0.2
    live = launch("dataset", env=env_for(endpoint, out))
    deadline = time.monotonic() + 30
    while not prefix.starts_after and time.monotonic() < deadline:
        time.sleep(0.01)
    assert prefix.starts_after, "the check did not start"
    live.signal(signal.SIGTERM)
    assert live.finish(timeout=10) == 143, live.stderr
    assert live.seconds < 15
    assert "Traceback" not in live.stderr
    assert wait_until_gone(out) == []
    assert find_problems(out) == []  # the complete tree stays complete


@pytest.mark.parametrize("records", [1, 2, 3, 10, 1500])
@pytest.mark.parametrize("count", [1, 2, 3, 4, 7])
def test_the_manifests_slices_hold_each_record_once_in_order_with_the_paths_at_their_edges(
    records, count, tmp_path
):
    files = {f'd/{i:05d} "q" ü.bin': FileRecord(i, None, f"e{i}", i) for i in range(records)}
    path = tmp_path / "manifest.json"
    write_manifest_file(path, Manifest("s3://bucket/d", None, files))
    slices = record_slices(path, count)
    assert slices is not None and 1 <= len(slices) <= min(count, records)
    read = [list(slice_rows(path, piece)) for piece in slices]
    assert [row for part in read for row in part] == [
        (name, r.size, r.version, r.mtime_ns) for name, r in sorted(files.items())
    ]
    for i, (piece, part) in enumerate(zip(slices, read, strict=True)):
        assert part, "no slice is empty"
        assert piece.after == (read[i - 1][-1][0] if i else None)
        assert piece.bound == (read[i + 1][0][0] if i + 1 < len(read) else None)


def test_a_manifest_with_no_records_or_in_another_layout_has_no_slices(tmp_path):
    path = tmp_path / "manifest.json"
    write_manifest_file(path, Manifest("s3://bucket/d", None, {}))
    assert record_slices(path, 4) is None
    path.write_text('{"format": 1, "source": "s3://b/d", "revision": null, "files": {"a": {}}}')
    assert record_slices(path, 4) is None

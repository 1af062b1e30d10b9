"""What fetching from the first listing page does differently, proved against a real HTTP server.

A listing of more than a page is planned page by page while the files of the first pages are
already being fetched. These specs pin what that must not change: a page that fails is asked
for again on its own; a listing that fails for good ends the run with what was fetched kept
for the rerun; a prefix that changes between pages gives a consistent tree; a disk found too
small after fetching began stops with exit 6 and nothing half-written under a final name;
a key that another key uses as a folder is still skipped, whichever page its folder is on.
"""

from __future__ import annotations

from initializers.journal import CommitLog
from initializers.manifest import find_problems
from tests.servers.paged_s3 import Prefix, env_for, holds_bodies, numbered_keys


def test_a_page_that_fails_is_asked_for_again_alone_and_every_file_comes_once(
    paged, run_initializer, tmp_path
):
    prefix = Prefix(numbered_keys(1500))  # 300 pages
    prefix.failures = {7: 1, 250: 2}
    out = tmp_path / "out"
    result = run_initializer("dataset", env=env_for(paged(prefix), out))
    assert result.code == 0, result.output
    assert prefix.requests[7] == 2 and prefix.requests[250] == 3
    assert set(prefix.requests.values()) <= {1, 2, 3}
    assert sum(prefix.requests.values()) == 300 + 3
    assert set(prefix.gets.values()) == {1} and len(prefix.gets) == 1500
    assert holds_bodies(out, prefix.keys) and find_problems(out) == []


def test_a_listing_that_fails_for_good_on_page_700_keeps_what_was_fetched_for_the_rerun(
    paged, run_initializer, tmp_path
):
    prefix = Prefix(numbered_keys(3600))  # 720 pages
    prefix.failures = {700: 10**6}
    out = tmp_path / "out"
    endpoint = paged(prefix)
    failed = run_initializer("dataset", env=env_for(endpoint, out, RETRIES="2"))
    assert failed.code == 7, failed.output
    assert "s3://bucket/d" in failed.stderr and "Traceback" not in failed.stderr
    assert not (out / ".initializer-manifest.json").exists()
    recorded = {f"d/{path}" for path, _ in CommitLog(out).records()}
    in_place = {key for key in recorded if (out / key.removeprefix("d/")).exists()}
    assert len(in_place) > 1000, "fetching did not start before the listing ended"
    assert holds_bodies(out, sorted(in_place))
    before = prefix.gets.copy()

    prefix.failures = {}
    rerun = run_initializer("dataset", env=env_for(endpoint, out))
    assert rerun.code == 0, rerun.output
    fetched_again = set(prefix.gets - before)
    assert fetched_again == set(prefix.keys) - in_place
    assert holds_bodies(out, prefix.keys) and find_problems(out) == []


def test_keys_added_while_the_listing_runs_are_fetched_if_listed_and_by_the_rerun_if_not(
    paged, run_initializer, tmp_path
):
    prefix = Prefix(numbered_keys(1500))
    behind, ahead = "d/000/00000-late.txt", "d/014/01499-late.txt"
    prefix.after_page = {100: [behind, ahead]}  # one before the position, one after
    out = tmp_path / "out"
    endpoint = paged(prefix)
    first = run_initializer("dataset", env=env_for(endpoint, out))
    assert first.code == 0, first.output
    assert (out / ahead.removeprefix("d/")).exists()
    assert not (out / behind.removeprefix("d/")).exists()
    assert find_problems(out) == []  # complete as listed

    gets = sum(prefix.gets.values())
    rerun = run_initializer("dataset", env=env_for(endpoint, out))
    assert rerun.code == 0, rerun.output
    assert sum(prefix.gets.values()) - gets == 1 and prefix.gets[behind] == 1
    assert holds_bodies(out, prefix.keys) and find_problems(out) == []


def test_a_disk_found_too_small_after_fetching_began_stops_with_exit_6_and_nothing_half_written(
    paged, run_initializer, tmp_path
):
    keys = numbered_keys(2000)
    prefix = Prefix(keys)
    prefix.sizes = {keys[1800]: 1 << 60}  # an exabyte, listed on page 361
    out = tmp_path / "out"
    result = run_initializer("dataset", env=env_for(paged(prefix), out))
    assert result.code == 6, result.output
    assert "free space or use a bigger volume" in result.stderr
    assert "Traceback" not in result.stderr
    kept = {path for path, _ in CommitLog(out).records()}
    assert kept, "fetching did not start before the listing ended"
    final = {
        p.relative_to(out).as_posix()
        for p in out.rglob("*")
        if p.is_file() and not p.name.startswith(".")
    }
    assert final <= kept and holds_bodies(out, [f"d/{path}" for path in final])
    assert not (out / ".initializer-manifest.json").exists()


def test_a_key_used_as_a_folder_on_a_later_page_is_skipped_as_when_listedholds_bodies(
    paged, run_initializer, tmp_path
):
    keys = numbered_keys(1500)
    # "d/007" sorts before "d/007/...": a file that is also a folder, whose files come on
    # the following pages; and "d/007-notes.txt", between them, is a file like any other.
    prefix = Prefix([*keys, "d/007", "d/007-notes.txt"])
    out = tmp_path / "out"
    result = run_initializer("dataset", env=env_for(paged(prefix), out))
    assert result.code == 0, result.output
    assert "skipped '007': another key uses it as a folder" in result.stderr
    assert (out / "007").is_dir() and (out / "007-notes.txt").is_file()
    assert prefix.gets["d/007"] == 0
    assert holds_bodies(out, [*keys, "d/007-notes.txt"]) and find_problems(out) == []


def test_pages_that_repeat_the_previous_pages_last_key_fetch_each_file_once(
    paged, run_initializer, tmp_path
):
    """A server whose pages overlap by a key (some S3-compatible stores, on a boundary): a key
    given twice is one file with one writer, not two jobs racing for one name."""
    prefix = Prefix(numbered_keys(1500))
    prefix.overlap = True
    out = tmp_path / "out"
    result = run_initializer("dataset", env=env_for(paged(prefix), out))
    assert result.code == 0, result.output
    assert "gave 374 key(s) twice in a row" in result.stderr  # 5 a page, 4 of them new
    assert set(prefix.gets.values()) == {1}, "every object fetched once"
    assert holds_bodies(out, prefix.keys) and find_problems(out) == []

"""Odd or hostile names in a listing and symlinks planted in the destination.

Nothing is ever written (or deleted) outside the destination: an unsafe name is skipped with a
warning naming it and why, and the rest is fetched; a symlink in the way stops the run with
exit 6 and a clear message, or is replaced (never followed) where that is safe.
"""

from __future__ import annotations

import os

import pytest

from tests.reliability.conftest import FIGURES, assert_identical, fill, s3_env

MIB = 1 << 20
GOOD = {"ok.txt": b"fine", "sub/ok2.txt": b"also fine", "a/b": b"the folder wins"}


def skipped_line(key: str, why: str) -> str:
    return f"skipped {key!r}: the name {why}"


def odd_keys(escape_target: str) -> dict[str, str]:
    """Key under the prefix -> the reason the initializer must give for skipping it."""
    return {
        "../escape.txt": "has '.', '..' or empty components",
        "..": "has '.', '..' or empty components",
        "./dot.txt": "has '.', '..' or empty components",
        "x/../../up.txt": "has '.', '..' or empty components",
        escape_target: "is absolute",  # "d/" + "/tmp/..." : a key with a leading '/'
        "back\\slash.txt": "contains a backslash",
        "..\\..\\win.txt": "contains a backslash",
        "ctrl\x01.txt": "contains a control character",
        "tab\t.txt": "contains a control character",
        "del\x7f.txt": "contains a control character",
        "n" * 300: "has a component longer than",
        "dir/" + "é" * 130: "has a component longer than",  # 130 characters, 260 bytes
        ".initializer-manifest.json": "collides with the initializer's own bookkeeping names",
        "weights.part": "collides with the initializer's own bookkeeping names",
    }


def test_odd_s3_keys_are_skipped_with_the_reason_and_nothing_lands_outside(
    bucket, run_initializer, tmp_path
):
    sandbox = tmp_path / "sandbox"
    out = sandbox / "dest"
    escape = tmp_path / "absolute-escape.txt"
    odd = odd_keys(str(escape))
    fill(bucket, "d", {**GOOD, "a": b"a file and a folder", **dict.fromkeys(odd, b"evil")})
    before = set(tmp_path.iterdir())

    result = run_initializer("dataset", env=s3_env(bucket, bucket.endpoint, "d", out))

    assert result.code == 0, result.output
    assert_identical(out, GOOD)
    for key, why in odd.items():
        assert skipped_line(f"d/{key}", why) in result.stderr, key
    assert "skipped 'a': another key uses it as a folder" in result.stderr
    assert set(tmp_path.iterdir()) == before | {sandbox}  # nothing new next to the sandbox
    assert [p.name for p in sandbox.iterdir()] == ["dest"]
    assert not escape.exists()
    FIGURES["hostile names skipped"] += len(odd) + 1


def test_odd_hub_paths_are_skipped_the_same_way(hub, run_initializer, tmp_path):
    odd = {
        "back\\slash.txt": "contains a backslash",
        "ctrl\x01.txt": "contains a control character",
        "n" * 300: "has a component longer than",
        ".initializer-manifest.json": "collides with the initializer's own bookkeeping names",
        "x/.weights.bin.part.journal": "collides with the initializer's own bookkeeping names",
    }
    files = {**GOOD, "a": b"file and folder", **dict.fromkeys(odd, b"evil")}
    hub.add_repo("org/odd", files, repo_type="dataset")
    out = tmp_path / "sandbox" / "dest"
    env = {
        "STORAGE_URI": "hf://datasets/org/odd",
        "HF_ENDPOINT": hub.endpoint,
        "OUTPUT_PATH": str(out),
    }
    result = run_initializer("dataset", env=env)
    assert result.code == 0, result.output
    assert_identical(out, GOOD)
    for path, why in odd.items():
        assert skipped_line(path, why) in result.stderr, path
    assert "skipped 'a': another key uses it as a folder" in result.stderr
    assert [p.name for p in (tmp_path / "sandbox").iterdir()] == ["dest"]
    FIGURES["hostile names skipped"] += len(odd) + 1


def test_a_uri_naming_one_object_with_an_unsafe_name_is_refused_not_written(
    bucket, run_initializer, tmp_path
):
    bucket.put("d/..", b"dot-dot object")
    sandbox = tmp_path / "sandbox"
    result = run_initializer("dataset", env=s3_env(bucket, bucket.endpoint, "d/..", sandbox / "o"))
    assert result.code == 4, result.output
    assert skipped_line("d/..", "has '.', '..' or empty components") in result.stderr
    assert "skipped as unsafe" in result.stderr
    assert not any(p.is_file() and p.name != ".initializer.lock" for p in sandbox.rglob("*"))


def test_a_listing_of_only_unsafe_names_says_so_and_exits_4(bucket, run_initializer, tmp_path):
    fill(bucket, "d", {"../x": b"1", "y\\z": b"2"})
    result = run_initializer("dataset", env=s3_env(bucket, bucket.endpoint, "d", tmp_path / "o"))
    assert result.code == 4, result.output
    assert "all 2 name(s) under" in result.stderr and "skipped as unsafe" in result.stderr
    assert "allow/ignore patterns" not in result.stderr  # the patterns are not the problem


@pytest.fixture
def outside(tmp_path):
    """A folder outside the destination holding a file that must never change."""
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "precious.txt").write_bytes(b"user data")
    return folder


def untouched(folder) -> bool:
    return (
        sorted(p.name for p in folder.iterdir()) == ["precious.txt"]
        and (folder / "precious.txt").read_bytes() == b"user data"
    )


# Where the symlink is planted (relative to the destination), what the source holds, and what
# the run must say; the symlink always points into ``outside``.
PLANTED = [
    ("sub", {"sub/f.txt": b"x"}, "is not a plain folder"),
    ("f.txt", {"f.txt": b"x"}, "is a symlink or a folder where the source has a file"),
    (".f.txt.part", {"f.txt": b"x"}, "cannot write"),
    (".big.bin.part.journal", {"big.bin": b"j" * (9 * MIB)}, "cannot write"),
    (".initializer.lock", {"f.txt": b"x"}, "cannot write"),
    (".initializer-commits.jsonl", {"f.txt": b"x"}, "cannot write"),
]


@pytest.mark.parametrize(("planted", "files", "message"), PLANTED, ids=[p[0] for p in PLANTED])
def test_a_symlink_planted_in_the_destination_stops_the_run_and_nothing_outside_changes(
    planted, files, message, bucket, run_initializer, tmp_path, outside
):
    fill(bucket, "d", files)
    out = tmp_path / "dest"
    out.mkdir()
    link = out / planted
    link.symlink_to(outside if planted == "sub" else outside / "precious.txt")
    result = run_initializer("dataset", env=s3_env(bucket, bucket.endpoint, "d", out))
    assert result.code == 6, result.output
    assert message in result.stderr
    assert "Traceback" not in result.output
    assert untouched(outside)
    FIGURES["symlinks planted"] += 1
    assert link.is_symlink()


MANIFEST_NAMES = [".initializer-manifest.json", "..initializer-manifest.json.tmp"]


@pytest.mark.parametrize("planted", MANIFEST_NAMES)
def test_a_symlink_planted_at_a_manifest_name_is_replaced_never_followed(
    planted, bucket, run_initializer, tmp_path, outside
):
    fill(bucket, "d", {"f.txt": b"x"})
    out = tmp_path / "dest"
    out.mkdir()
    (out / planted).symlink_to(outside / "precious.txt")
    result = run_initializer("dataset", env=s3_env(bucket, bucket.endpoint, "d", out))
    assert result.code == 0, result.output
    assert untouched(outside)
    FIGURES["symlinks planted"] += 1
    assert not (out / ".initializer-manifest.json").is_symlink()
    assert_identical(out, {"f.txt": b"x"})


@pytest.mark.parametrize("kind", ["hard link", "named pipe"])
def test_a_hard_link_or_pipe_planted_at_the_manifest_temporary_name_is_replaced_not_written(
    kind, bucket, run_initializer, tmp_path, outside
):
    fill(bucket, "d", {"f.txt": b"x"})
    out = tmp_path / "dest"
    out.mkdir()
    planted = out / MANIFEST_NAMES[1]
    if kind == "hard link":
        os.link(outside / "precious.txt", planted)
    else:
        os.mkfifo(planted)  # opened for writing, it would block the run forever
    result = run_initializer("dataset", env=s3_env(bucket, bucket.endpoint, "d", out))
    assert result.code == 0, result.output
    assert untouched(outside)
    assert not planted.exists()
    assert_identical(out, {"f.txt": b"x"})


def test_a_symlink_planted_at_a_final_name_during_the_fetch_is_replaced_not_followed(
    bucket, s3_endpoint, proxies, launch, tmp_path, outside
):
    body = os.urandom(2 * MIB)
    fill(bucket, "d", {"f.bin": body})
    proxy = proxies(s3_endpoint)
    proxy.hold(lambda r: r.method == "GET" and "list-type" not in r.query)
    out = tmp_path / "dest"
    live = launch("dataset", env=s3_env(bucket, proxy.url, "d", out))
    proxy.wait_parked(1)  # planned and checked: now the attacker plants the link
    (out / "f.bin").symlink_to(outside / "precious.txt")
    proxy.release()
    assert live.finish() == 0, live.stderr
    assert not (out / "f.bin").is_symlink()
    assert (out / "f.bin").read_bytes() == body
    assert untouched(outside)
    FIGURES["symlinks planted"] += 1


def test_files_no_longer_listed_are_not_deleted_through_a_symlinked_folder(
    bucket, run_initializer, tmp_path, outside
):
    fill(bucket, "d", {"keep.txt": b"k", "sub/precious.txt": b"ours"})
    out = tmp_path / "dest"
    env = s3_env(bucket, bucket.endpoint, "d", out)
    assert run_initializer("dataset", env=env).code == 0
    # The source drops sub/precious.txt; meanwhile sub/ became a link to someone else's folder
    # holding a file of the same name.
    bucket.client.delete_object(Bucket=bucket.name, Key="d/sub/precious.txt")  # type: ignore[attr-defined]
    (out / "sub" / "precious.txt").unlink()
    (out / "sub").rmdir()
    (out / "sub").symlink_to(outside)
    result = run_initializer("dataset", env=env)
    assert result.code == 0, result.output
    assert untouched(outside)
    FIGURES["symlinks planted"] += 1
    assert_identical(out, {"keep.txt": b"k"})

"""``--dry-run``: a run's plan, printed, and nothing written anywhere.

Each spec runs the real CLI against moto's S3 server (through a proxy that sees every request),
and compares the destination before and after, byte for byte and time for time."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.conftest import Bucket
from tests.servers.faultproxy import FaultProxy


def snapshot(root: Path) -> dict[str, tuple[int, int, bytes]]:
    """Every entry under ``root`` (hidden ones too): mode, mtime and content."""
    if not root.exists():
        return {}
    return {
        p.relative_to(root).as_posix(): (
            p.lstat().st_mode,
            p.lstat().st_mtime_ns,
            p.read_bytes() if p.is_file() else b"",
        )
        for p in [root, *root.rglob("*")]
    }


@pytest.fixture
def proxied(bucket: Bucket):
    proxy = FaultProxy(bucket.endpoint).start()
    yield proxy
    proxy.stop()


def _dry(run_initializer, kind: str, env: dict[str, str], *flags: str):
    result = run_initializer(kind, "--dry-run", *flags, env=env)
    assert result.code == 0, result.output
    return result


def test_a_dry_run_prints_what_a_run_would_fetch_keep_and_remove_and_changes_nothing(
    bucket, proxied, run_initializer, tmp_path
):
    for key, body in {"d/same.txt": b"same", "d/changed.txt": b"v1", "d/gone.txt": b"x"}.items():
        bucket.put(key, body)
    out, scratch = tmp_path / "out", tmp_path / "scratch"
    scratch.mkdir()
    env = bucket.env("d", OUTPUT_PATH=str(out), ENDPOINT=proxied.url, TMPDIR=str(scratch))
    assert run_initializer("dataset", env=env).code == 0
    bucket.put("d/changed.txt", b"version 2")
    bucket.put("d/new/file.bin", os.urandom(3000))
    bucket.client.delete_object(Bucket=bucket.name, Key="d/gone.txt")
    before, requests = snapshot(out), len(proxied.received)

    result = _dry(run_initializer, "dataset", env)

    lines = result.stdout.splitlines()
    assert [line.split()[0] + " " + line.split()[-1] for line in lines[:4]] == [
        "keep same.txt",
        "fetch changed.txt",
        "fetch new/file.bin",
        "remove gone.txt",
    ]
    assert "3 files" in lines[4] and "a run would fetch 2 (" in lines[4]
    assert "keep 1 and remove 1" in lines[4]
    assert lines[-1] == "dry run: nothing was written"
    assert snapshot(out) == before, "the destination is only read"
    assert list(scratch.iterdir()) == [], "the scratch table went with the run"
    # Listed and planned: no object's bytes were asked for.
    assert all(r.method != "GET" or "list-type=2" in r.query for r in proxied.received[requests:])


def test_a_dry_run_into_a_folder_not_made_yet_plans_every_file_and_makes_no_folder(
    bucket, run_initializer, tmp_path
):
    bucket.put("d/a.txt", b"a")
    out = tmp_path / "not" / "yet"
    result = _dry(run_initializer, "dataset", bucket.env("d", OUTPUT_PATH=str(out)))
    assert result.stdout.splitlines()[0].split() == ["fetch", "1", "B", "a.txt"]
    assert not (tmp_path / "not").exists()


def test_a_dry_run_of_a_complete_destination_says_so(bucket, run_initializer, tmp_path):
    bucket.put("d/a.txt", b"a")
    env = bucket.env("d", OUTPUT_PATH=str(tmp_path / "out"))
    assert run_initializer("dataset", env=env).code == 0
    result = _dry(run_initializer, "dataset", env)
    assert "already complete: a run would fetch nothing" in result.stdout


def test_a_dry_run_in_json_is_one_object_per_file_and_a_summary(bucket, run_initializer, tmp_path):
    """The model's defaults apply as in a run: the .bin weights are left for the safetensors."""
    for key in ("m/config.json", "m/model.safetensors", "m/pytorch_model.bin"):
        bucket.put(key, b"{}")
    env = bucket.env("m", OUTPUT_PATH=str(tmp_path / "out"), LOG_FORMAT="json")
    result = _dry(run_initializer, "model", env)
    objects = [json.loads(line) for line in result.stdout.splitlines()]
    assert objects[:-1] == [
        {"action": "fetch", "path": "config.json", "size": 2},
        {"action": "fetch", "path": "model.safetensors", "size": 2},
    ]
    summary = objects[-1]["summary"]
    assert (summary["files"], summary["fetch"], summary["complete"]) == (2, 2, False)


def test_a_dry_run_with_the_asset_store_names_the_entry_and_creates_none(
    bucket, run_initializer, tmp_path
):
    bucket.put("d/a.txt", b"a")
    cache = tmp_path / "cache"
    cache.mkdir()
    env = bucket.env("d", OUTPUT_PATH=str(tmp_path / "out"), CACHE_DIR=str(cache))
    result = _dry(run_initializer, "dataset", env)
    assert "the asset store's entry " in result.stdout and "does not exist yet" in result.stdout
    assert list(cache.iterdir()) == [] and not (tmp_path / "out").exists()
    assert run_initializer("dataset", env=env).code == 0
    again = _dry(run_initializer, "dataset", env)
    assert " exists; " in again.stdout and "already complete" in again.stdout


def test_a_dry_run_of_a_shard_plans_its_share_only(bucket, run_initializer, tmp_path):
    sizes = {f"d/f{i}.bin": 1000 * (i + 1) for i in range(4)}
    for key, size in sizes.items():
        bucket.put(key, b"x" * size)
    env = bucket.env("d", OUTPUT_PATH=str(tmp_path / "out"), SHARDS="2", SHARD_INDEX="0")
    result = _dry(run_initializer, "dataset", env)
    planned = [line.split()[-1] for line in result.stdout.splitlines() if line.startswith("fetch")]
    assert sorted(planned) == ["f0.bin", "f3.bin"]  # 4000 + 1000 against 3000 + 2000
    assert "shard 0 (of 2) takes 2 of 4 files" in result.stdout


def test_a_dry_run_lists_as_a_run_would_and_fails_the_same_way(bucket, run_initializer, tmp_path):
    bucket.put("d/a.txt", b"a")
    env = bucket.env("d", OUTPUT_PATH=str(tmp_path / "out"), STORAGE_URI="s3://no-such-bucket/d")
    result = run_initializer("dataset", "--dry-run", env=env)
    assert result.code == 4, result.output
    assert "Traceback" not in result.stderr and not (tmp_path / "out").exists()

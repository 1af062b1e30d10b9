"""Fast by default, durable on request, and no file a crash destroyed is ever trusted.

By default a run does not wait for the disk; its manifest says which boot wrote the files and
that they were not synced. A crash (a power loss, a VM reset) can then leave a file with its
name, size and mtime intact and its bytes gone. The crash itself cannot run here: it is
simulated by doing to the tree what one may do (a file zeroed in place, size and mtime kept,
and another truncated) and by a manifest that says an earlier boot wrote the files. The rerun
checks those files' bytes against their recorded digests before it keeps them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.conftest import Bucket
from tests.reliability.conftest import assert_identical, dataset, fill, s3_env
from tests.servers.registry import tar_bytes

MANIFEST = ".initializer-manifest.json"
SIZES = {f"shard-{i}.bin": 4096 * (i + 1) for i in range(6)}


def _head(out: Path) -> dict:
    return json.loads((out / MANIFEST).read_text().splitlines()[0].rsplit(', "files"', 1)[0] + "}")


def _as_if_written_by_an_earlier_boot(out: Path) -> None:
    manifest = out / MANIFEST
    first, rest = manifest.read_text().split("\n", 1)
    head = _head(out)
    assert head["boot_id"] != "an-earlier-boot"
    changed = first.replace(json.dumps(head["boot_id"]), json.dumps("an-earlier-boot"), 1)
    manifest.write_text(changed + "\n" + rest)


def _zero_in_place(path: Path) -> None:
    """What a crash can leave: the name, the size and the mtime, not the bytes."""
    info = path.stat()
    path.write_bytes(b"\0" * info.st_size)
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns))


def test_after_a_crash_only_the_files_whose_bytes_it_destroyed_are_fetched_again(
    bucket: Bucket, run_initializer, tmp_path
):
    files = dataset(40, SIZES)
    fill(bucket, "d", files)
    out = tmp_path / "out"
    env = s3_env(bucket, bucket.endpoint, "d", out)
    first = run_initializer("dataset", env=env)
    assert first.code == 0, first.stderr
    assert _head(out)["durable"] is False and _head(out)["boot_id"]

    _zero_in_place(out / "shard-2.bin")
    with open(out / "shard-4.bin", "r+b") as truncated:
        truncated.truncate(100)
    _as_if_written_by_an_earlier_boot(out)

    again = run_initializer("dataset", env=env)
    assert again.code == 0, again.stderr
    assert "done — 2 fetched, 4 already present" in again.stderr
    assert "6 file(s) were written unsynced before the last boot" in again.stderr
    assert_identical(out, files)


def test_a_rerun_in_the_same_boot_trusts_an_unsynced_tree_without_reading_it(
    bucket: Bucket, run_initializer, tmp_path
):
    files = dataset(41, SIZES)
    fill(bucket, "d", files)
    out = tmp_path / "out"
    env = s3_env(bucket, bucket.endpoint, "d", out)
    assert run_initializer("dataset", env=env).code == 0
    again = run_initializer("dataset", env=env)
    assert again.code == 0
    assert "already complete (6 files" in again.stderr
    assert "unsynced" not in again.stderr


def test_a_durable_run_says_so_and_its_tree_is_trusted_after_any_boot(
    bucket: Bucket, run_initializer, tmp_path
):
    files = dataset(42, SIZES)
    fill(bucket, "d", files)
    out = tmp_path / "out"
    env = s3_env(bucket, bucket.endpoint, "d", out, DURABLE="true")
    assert run_initializer("dataset", env=env).code == 0
    assert _head(out)["durable"] is True
    _as_if_written_by_an_earlier_boot(out)
    again = run_initializer("dataset", "--durable", env=env)
    assert again.code == 0
    assert "already complete (6 files" in again.stderr
    assert_identical(out, files)


def test_an_unsynced_unpack_is_unpacked_again_after_a_crash_and_a_durable_one_is_trusted(
    web, run_initializer, tmp_path
):
    members = dataset(42, {f"part-{i}.json": 5_000 + i for i in range(4)})
    url = web.put("/x/parts.tar.gz", tar_bytes(dict(members), gzip=True))
    out = tmp_path / "out"
    args = ("--storage-uri", url, "--output", str(out))
    assert run_initializer("dataset", *args).code == 0
    assert _head(out)["durable"] is False and _head(out)["boot_id"]
    _zero_in_place(out / "part-1.json")
    _as_if_written_by_an_earlier_boot(out)

    again = run_initializer("dataset", *args)
    assert again.code == 0, again.stderr
    assert "unpacked" in again.stderr
    assert_identical(out, members)

    durable = tmp_path / "durable"
    run = ("--storage-uri", url, "--output", str(durable), "--durable")
    assert run_initializer("dataset", *run).code == 0
    assert _head(durable)["durable"] is True
    _as_if_written_by_an_earlier_boot(durable)
    trusted = run_initializer("dataset", *run)
    assert trusted.code == 0 and "already complete" in trusted.stderr

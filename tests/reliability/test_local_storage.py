"""The destination volume: read-only, full mid-write, or already holding someone's files.

Real small filesystems (tmpfs, mounted by the test as root) stand in for a PVC: the disk really
fills up, the mount really is read-only.
"""

from __future__ import annotations

import shutil
import subprocess

from initializers.journal import RangeJournal
from initializers.progress import human_bytes
from tests.reliability.conftest import (
    FIGURES,
    assert_identical,
    dataset,
    fill,
    is_object_get,
    s3_env,
)

MIB = 1 << 20


def remount_read_only(folder) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True, capture_output=True)


def test_a_read_only_destination_exits_6_naming_the_read_only_volume(
    bucket, run_initializer, tmpfs
):
    fill(bucket, "d", {"a.txt": b"a"})
    volume = tmpfs("ro-volume", 4)
    (volume / "existing").mkdir()
    remount_read_only(volume)
    for out in (volume / "existing", volume / "new" / "sub"):
        result = run_initializer("dataset", env=s3_env(bucket, bucket.endpoint, "d", out))
        assert result.code == 6, result.output
        assert "read-only" in result.stderr.lower(), result.stderr
        assert str(out) in result.stderr
        assert "Traceback" not in result.output


def test_a_disk_that_fills_up_mid_write_exits_6_and_the_fetch_resumes_once_space_is_freed(
    bucket, s3_endpoint, proxies, launch, run_initializer, tmpfs
):
    files = dataset(41, {"big.bin": 20 * MIB, "small-1.txt": 100_000, "small-2.txt": 200_000})
    fill(bucket, "d", files)
    volume = tmpfs("small-volume", 32)
    out = volume / "dataset"
    proxy = proxies(s3_endpoint)
    proxy.hold(is_object_get)
    env = s3_env(bucket, proxy.url, "d", out, WORKERS="2")
    live = launch("dataset", env=env)
    proxy.wait_parked(1)  # the space check passed; now something else fills the volume
    filler = volume / "someone-elses-file"
    with filler.open("wb") as handle:
        handle.write(b"\0" * (shutil.disk_usage(volume).free - 12 * MIB))
    proxy.release()

    assert live.finish() == 6, live.stderr
    assert "no space left on the volume while writing" in live.stderr
    assert "rerun (fetched bytes are kept)" in live.stderr
    assert "Traceback" not in live.stderr
    assert not (out / "big.bin").exists()
    head = bucket.client.head_object(Bucket=bucket.name, Key="d/big.bin")  # type: ignore[attr-defined]
    identity = {"size": 20 * MIB, "version": head["ETag"].strip('"')}
    kept = sum(e - s for s, e in RangeJournal(out / ".big.bin.part.journal", identity).load())
    assert kept >= 8 * MIB  # at least one checkpoint reached the journal before the disk filled

    filler.unlink()  # space is freed
    rerun = run_initializer("dataset", env=env)
    assert rerun.code == 0, rerun.output
    assert f"resuming {human_bytes(kept)} already on disk" in rerun.stderr
    assert_identical(out, files)
    FIGURES["disk-full failures resumed"] += 1


def test_a_destination_holding_unrelated_files_keeps_every_one_of_them(
    bucket, run_initializer, tmp_path
):
    out = tmp_path / "dest"
    users = {
        "notes.txt": b"my notes",
        "results/run-1.csv": b"1,2,3",
        "sub/my-own.txt": b"next to the source's files",
        ".hidden-config": b"dotfile",
        "sub/.cache/x": b"cache",
    }
    for name, body in users.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_bytes(body)
    fill(bucket, "d", {"sub/a.txt": b"a", "b.txt": b"b"})
    env = s3_env(bucket, bucket.endpoint, "d", out)
    assert run_initializer("dataset", env=env).code == 0

    bucket.client.delete_object(Bucket=bucket.name, Key="d/sub/a.txt")  # type: ignore[attr-defined]
    result = run_initializer("dataset", env=env)
    assert result.code == 0, result.output
    assert "removed 1 file(s) no longer in the source" in result.stderr
    assert not (out / "sub" / "a.txt").exists()  # ours, and no longer listed: removed
    for name, body in users.items():
        assert (out / name).read_bytes() == body, name


def test_a_user_file_at_a_name_the_source_lists_is_replaced_by_the_source_file(
    bucket, run_initializer, tmp_path
):
    out = tmp_path / "dest"
    out.mkdir()
    (out / "config.json").write_bytes(b"the user's version")
    fill(bucket, "d", {"config.json": b"the source's version"})
    result = run_initializer("dataset", env=s3_env(bucket, bucket.endpoint, "d", out))
    assert result.code == 0, result.output
    assert (out / "config.json").read_bytes() == b"the source's version"

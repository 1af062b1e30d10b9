"""Sharding: K initializer processes, each with its index, fill one folder as an Indexed Job's pods
would fill one ReadWriteMany volume.

The fault proxy in front of the S3 server counts every object GET, so "each object's bytes
fetched once across all shards" is checked on what the server was asked for.
"""

from __future__ import annotations

import random
import signal
import time
from pathlib import Path

import pytest

from initializers.manifest import find_problems
from initializers.shards import partition
from initializers.sources.base import RemoteFile
from tests.reliability.conftest import (
    FIGURES,
    assert_each_hub_file_served_once,
    assert_identical,
    dataset,
    fill,
    is_object_get,
    one_manifest,
    s3_env,
)
from tests.servers.faultproxy import Fault

MIB = 1 << 20


def shard_env(bucket, endpoint: str, out: Path, count: int, index: int, **extra: str) -> dict:
    return s3_env(
        bucket, endpoint, "d", out, SHARDS=str(count), JOB_COMPLETION_INDEX=str(index), **extra
    )


def a_dataset(seed: int) -> dict[str, bytes]:
    rng = random.Random(seed)
    sizes = {f"part-{i:02d}.bin": rng.randrange(1, 3 * MIB) for i in range(14)}
    sizes.update({"meta/a.json": 300, "meta/b.json": 0, "README.md": 2_000})
    return dataset(seed, sizes)


def object_gets(proxy, bucket, files) -> dict[str, int]:
    """GETs per object that has bytes (an empty one is created without a GET)."""
    return {
        name: proxy.seen[f"GET /{bucket.name}/d/{name}"] for name, body in files.items() if body
    }


def files_of(sizes: dict[str, int]) -> list[RemoteFile]:
    return [RemoteFile(path, size, "v") for path, size in sizes.items()]


def test_the_partition_balances_bytes_and_every_pod_computes_the_same_one():
    files = files_of({f"f{i}": size for i, size in enumerate([900, 500, 400, 300, 300, 100, 0])})

    shares = partition(files, 3)

    assert shares == partition(list(reversed(files)), 3)  # listing order does not matter
    assert sorted(f.path for share in shares for f in share) == sorted(f.path for f in files)
    loads = sorted(sum(f.size for f in share) for share in shares)
    assert loads == [800, 800, 900]


def test_more_shards_than_files_leaves_some_shares_empty_and_none_twice():
    shares = partition(files_of({"a": 10, "b": 5}), 4)

    assert [len(share) for share in shares] == [1, 1, 0, 0]


@pytest.mark.parametrize("count", [2, 4])
def test_k_shards_started_together_build_one_tree_with_one_manifest_fetching_each_object_once(
    count, bucket, s3_endpoint, proxies, launch, tmp_path
):
    files = a_dataset(80 + count)
    fill(bucket, "d", files)
    proxy = proxies(s3_endpoint)
    out = tmp_path / "shared-volume"
    proxy.hold(is_object_get)  # every shard is listed and planned before any byte flows
    runs = [
        launch("dataset", env=shard_env(bucket, proxy.url, out, count, i)) for i in range(count)
    ]
    for run in runs:
        run.wait_for("shard ")
    proxy.release()

    assert [run.finish() for run in runs] == [0] * count, [r.stderr for r in runs]
    assert_identical(out, files)
    assert set(one_manifest(out)["files"]) == set(files)
    assert find_problems(out) == []
    assert set(object_gets(proxy, bucket, files).values()) == {1}
    assert sum("manifest written" in run.stderr for run in runs) == 1
    assert not (out / ".initializer-shards").exists()


def test_shards_killed_at_random_points_and_restarted_end_byte_identical(
    bucket, s3_endpoint, proxies, launch, tmp_path
):
    count = 3
    files = a_dataset(90)
    # One 12 MiB file per share at 1.5 MiB/s a connection: every shard runs for 8 s or more,
    # so each kill below lands mid-fetch, whichever shard it picks.
    files.update(dataset(91, {f"big-{i}.bin": 12 * MIB for i in range(count)}))
    fill(bucket, "d", files)
    proxy = proxies(s3_endpoint, rate=1.5 * MIB)
    out = tmp_path / "shared-volume"
    rng = random.Random(92)
    runs = {
        i: launch("dataset", env=shard_env(bucket, proxy.url, out, count, i)) for i in range(count)
    }
    kills = 0
    for _ in range(4):  # kill a random shard at a random moment, then restart it (the Job would)
        victim = rng.randrange(count)
        live = runs[victim]
        live.wait_for("fetching ")
        time.sleep(rng.uniform(0.2, 1.5))
        assert live.proc.poll() is None, live.stderr  # still fetching: the kill is mid-way
        live.kill()
        kills += 1
        runs[victim] = launch("dataset", env=shard_env(bucket, proxy.url, out, count, victim))

    codes = [run.finish() for run in runs.values()]

    assert codes == [0] * count, [r.stderr for r in runs.values()]
    FIGURES["SIGKILLs survived"] += kills
    assert_identical(out, files)
    assert set(one_manifest(out)["files"]) == set(files)
    assert find_problems(out) == []
    total = sum(len(body) for body in files.values())
    assert proxy.body_bytes < total * 1.6  # resumed, never fetched whole again by another shard


def test_a_pod_that_finds_the_manifest_written_exits_0_fetching_nothing(
    bucket, s3_endpoint, proxies, run_initializer, tmp_path
):
    files = a_dataset(93)
    fill(bucket, "d", files)
    out = tmp_path / "shared-volume"
    for i in range(2):
        done = run_initializer("dataset", env=shard_env(bucket, bucket.endpoint, out, 2, i))
        assert done.code == 0, done.output
    proxy = proxies(s3_endpoint)

    again = run_initializer("dataset", env=shard_env(bucket, proxy.url, out, 2, 1))

    assert again.code == 0, again.output
    assert "already complete" in again.stderr
    assert set(object_gets(proxy, bucket, files).values()) == {0}


def test_a_shard_that_keeps_failing_fails_its_pod_and_no_manifest_is_written(
    bucket, s3_endpoint, proxies, run_initializer, tmp_path
):
    files = a_dataset(94)
    fill(bucket, "d", files)
    proxy = proxies(s3_endpoint)
    out = tmp_path / "shared-volume"
    shares = partition([RemoteFile(name, len(body), None) for name, body in files.items()], 2)
    doomed = shares[1][0].path
    proxy.force(Fault.error(503), times=10_000, match=lambda r: r.path.endswith("/" + doomed))

    healthy = run_initializer("dataset", env=shard_env(bucket, proxy.url, out, 2, 0))
    failing = run_initializer("dataset", env=shard_env(bucket, proxy.url, out, 2, 1, RETRIES="2"))

    assert healthy.code == 0, healthy.output
    assert failing.code == 7, failing.output
    assert doomed in failing.stderr
    assert not (out / ".initializer-manifest.json").exists()
    assert find_problems(out) != []


def test_a_source_that_changes_between_shards_starting_fails_clearly_and_builds_no_mixed_tree(
    bucket, run_initializer, tmp_path
):
    files = a_dataset(95)
    fill(bucket, "d", files)
    out = tmp_path / "shared-volume"
    first = run_initializer("dataset", env=shard_env(bucket, bucket.endpoint, out, 2, 0))
    assert first.code == 0, first.output
    bucket.put("d/README.md", b"a new version, uploaded while the shards start")

    second = run_initializer("dataset", env=shard_env(bucket, bucket.endpoint, out, 2, 1))

    assert second.code == 5, second.output
    assert "the source changed while the shards started" in second.stderr
    assert "no mixed tree" in second.stderr
    assert not (out / ".initializer-manifest.json").exists()


def test_a_new_run_replaces_the_plan_an_earlier_failed_run_left(bucket, run_initializer, tmp_path):
    files = a_dataset(96)
    fill(bucket, "d", files)
    out = tmp_path / "shared-volume"
    run = {"SHARD_RUN": "job-uid-1"}
    assert (
        run_initializer("dataset", env=shard_env(bucket, bucket.endpoint, out, 2, 0, **run)).code
        == 0
    )
    bucket.put("d/README.md", b"changed after the first run failed half way")
    files["README.md"] = b"changed after the first run failed half way"

    rerun = {"SHARD_RUN": "job-uid-2"}
    results = [
        run_initializer("dataset", env=shard_env(bucket, bucket.endpoint, out, 2, i, **rerun))
        for i in range(2)
    ]

    assert [r.code for r in results] == [0, 0], [r.output for r in results]
    assert "replacing the plan of an earlier run" in results[0].stderr
    assert "fetching 1 of" in results[0].stderr + results[1].stderr  # only the changed file
    assert_identical(out, files)
    assert set(one_manifest(out)["files"]) == set(files)


def test_shards_fill_one_cache_entry_together_and_link_it(
    bucket, s3_endpoint, proxies, launch, tmp_path
):
    files = a_dataset(97)
    fill(bucket, "d", files)
    proxy = proxies(s3_endpoint)
    cache = tmp_path / "cache"
    model = tmp_path / "workspace" / "dataset"
    proxy.hold(is_object_get)
    runs = [
        launch("dataset", env=shard_env(bucket, proxy.url, model, 2, i, CACHE_DIR=str(cache)))
        for i in range(2)
    ]
    proxy.wait_parked(2)  # both shards are fetching at once: the entry's lock is shared
    proxy.release()

    assert [run.finish() for run in runs] == [0, 0], [r.stderr for r in runs]
    assert model.is_symlink()
    assert_identical(model, files)
    assert find_problems(model) == []
    assert set(object_gets(proxy, bucket, files).values()) == {1}


def test_shards_stopped_by_sigterm_resume_on_restart(
    bucket, s3_endpoint, proxies, launch, tmp_path
):
    files = a_dataset(98)
    fill(bucket, "d", files)
    proxy = proxies(s3_endpoint)
    out = tmp_path / "shared-volume"
    proxy.hold(is_object_get)
    stopped = launch("dataset", env=shard_env(bucket, proxy.url, out, 2, 0))
    proxy.wait_parked(1)
    stopped.signal(signal.SIGTERM)
    assert stopped.finish() == 143, stopped.stderr
    FIGURES["SIGTERMs survived"] += 1
    proxy.release()

    runs = [launch("dataset", env=shard_env(bucket, proxy.url, out, 2, i)) for i in range(2)]

    assert [run.finish() for run in runs] == [0, 0], [r.stderr for r in runs]
    assert_identical(out, files)


def test_two_shards_fetch_a_hub_model_once(hub, launch, tmp_path):
    files = dataset(99, {f"model-{i}.safetensors": (i + 1) * MIB for i in range(4)})
    files["config.json"] = b"{}"
    hub.add_repo("org/m", files)
    out = tmp_path / "shared-volume"
    env = {"STORAGE_URI": "hf://org/m", "HF_ENDPOINT": hub.endpoint, "OUTPUT_PATH": str(out)}
    runs = [
        launch("model", env={**env, "SHARDS": "2", "JOB_COMPLETION_INDEX": str(i)})
        for i in range(2)
    ]

    assert [run.finish() for run in runs] == [0, 0], [r.stderr for r in runs]
    assert_identical(out, files)
    assert set(one_manifest(out)["files"]) == set(files)
    assert_each_hub_file_served_once(hub, files)

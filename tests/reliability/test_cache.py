"""The shared asset store (CACHE_DIR): one fetch per source version, however many TrainJobs.

Each "TrainJob" is a real CLI process with its own workspace folder; they share one cache folder,
as pods share a ReadWriteMany volume. The fault proxy in front of the S3 server counts what
crossed the network and, by parking object GETs, makes a second initializer arrive while the
first one is fetching, whatever the machine's speed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from initializers.cache import AssetCache, EntryInfo, to_prune
from initializers.cachetool import parse_duration, parse_size
from initializers.manifest import MANIFEST_NAME, find_problems
from tests.reliability.conftest import (
    FIGURES,
    assert_each_hub_file_served_once,
    assert_identical,
    dataset,
    fill,
    is_object_get,
    s3_env,
)
from tests.servers.hub import HubServer

MIB = 1 << 20
WAITING = "waiting for another initializer fetching"


def workspace(tmp_path: Path, n: int) -> Path:
    return tmp_path / f"trainjob-{n}" / "dataset"


def the_entry(cache: Path) -> Path:
    entries = [p for p in (cache / "entries").iterdir() if p.is_dir()]
    assert len(entries) == 1, entries
    return entries[0]


def cache_tool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from initializers.cachetool import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def start_together(launch, proxy, envs: list[dict[str, str]]) -> list:
    """Start one initializer per env while the proxy parks object GETs; return once one holds
    the entry and every other one says what it waits for, then let the bytes flow."""
    proxy.hold(is_object_get)
    runs = [launch("dataset", env=env) for env in envs]
    proxy.wait_parked(1)
    deadline = time.monotonic() + 60
    while sum(WAITING in r.stderr for r in runs) < len(runs) - 1:
        assert time.monotonic() < deadline, "\n".join(r.stderr for r in runs)
        time.sleep(0.02)
    proxy.release()
    return runs


def test_two_trainjobs_started_together_fetch_each_file_once_and_link_one_entry(
    bucket, s3_endpoint, proxies, launch, tmp_path
):
    files = dataset(61, {"a.bin": 6 * MIB, "b/c.json": 1_000, "d.txt": 20_000})
    fill(bucket, "d", files)
    proxy = proxies(s3_endpoint)
    cache = tmp_path / "cache"
    envs = [
        s3_env(bucket, proxy.url, "d", workspace(tmp_path, n), CACHE_DIR=str(cache)) for n in (1, 2)
    ]

    runs = start_together(launch, proxy, envs)

    assert [r.finish() for r in runs] == [0, 0], [r.stderr for r in runs]
    entry = the_entry(cache)
    for n in (1, 2):
        out = workspace(tmp_path, n)
        assert out.is_symlink() and out.resolve() == entry.resolve()
        assert_identical(out, files)
        assert find_problems(out) == []
    assert all(proxy.seen[f"GET /{bucket.name}/d/{name}"] == 1 for name in files), proxy.seen
    waiter = next(r for r in runs if WAITING in r.stderr)
    assert f"{entry.name}:" in waiter.stderr and "already complete" in waiter.stderr


def test_eight_trainjobs_started_together_fetch_each_file_once(
    bucket, s3_endpoint, proxies, launch, tmp_path
):
    files = dataset(62, {"a.bin": 3 * MIB, "b.bin": 2 * MIB, "c/d.json": 500})
    fill(bucket, "d", files)
    proxy = proxies(s3_endpoint)
    cache = tmp_path / "cache"
    envs = [
        s3_env(bucket, proxy.url, "d", workspace(tmp_path, n), CACHE_DIR=str(cache), WORKERS="2")
        for n in range(8)
    ]

    runs = start_together(launch, proxy, envs)

    assert [r.finish() for r in runs] == [0] * 8, [r.stderr for r in runs if r.proc.returncode]
    entry = the_entry(cache)
    for n in range(8):
        assert workspace(tmp_path, n).resolve() == entry.resolve()
        assert_identical(workspace(tmp_path, n), files)
    assert all(proxy.seen[f"GET /{bucket.name}/d/{name}"] == 1 for name in files), proxy.seen


def test_the_next_trainjob_resumes_the_entry_a_killed_one_was_filling(
    bucket, s3_endpoint, proxies, launch, tmp_path
):
    files = dataset(63, {"big.bin": 48 * MIB})
    fill(bucket, "d", files)
    proxy = proxies(s3_endpoint, rate=MIB)  # per connection: slow enough to kill it half way
    cache = tmp_path / "cache"
    first = launch(
        "dataset", env=s3_env(bucket, proxy.url, "d", workspace(tmp_path, 1), CACHE_DIR=str(cache))
    )
    first.wait_for("cache: entry")
    deadline = time.monotonic() + 60
    while proxy.body_bytes < 20 * MIB:
        assert time.monotonic() < deadline, first.stderr
        time.sleep(0.05)
    first.kill()
    FIGURES["SIGKILLs survived (the lock holder)"] += 1
    sent_before = proxy.body_bytes

    second = launch(
        "dataset", env=s3_env(bucket, proxy.url, "d", workspace(tmp_path, 2), CACHE_DIR=str(cache))
    )

    assert second.finish() == 0, second.stderr
    assert "resuming" in second.stderr
    assert_identical(workspace(tmp_path, 2), files)
    assert not workspace(tmp_path, 1).exists()  # the killed one never linked a partial entry
    assert proxy.body_bytes - sent_before < 40 * MIB  # the rest, not all 48 MiB again


def test_an_unchanged_source_is_reused_with_no_byte_fetched(
    bucket, s3_endpoint, proxies, run_initializer, tmp_path
):
    files = dataset(64, {"a.bin": 2 * MIB, "b.txt": 10})
    fill(bucket, "d", files)
    proxy = proxies(s3_endpoint)
    cache = tmp_path / "cache"
    first = run_initializer(
        "dataset", env=s3_env(bucket, proxy.url, "d", workspace(tmp_path, 1), CACHE_DIR=str(cache))
    )
    assert first.code == 0, first.output
    before = proxy.body_bytes, dict(proxy.seen)

    second = run_initializer(
        "dataset", env=s3_env(bucket, proxy.url, "d", workspace(tmp_path, 2), CACHE_DIR=str(cache))
    )

    assert second.code == 0, second.output
    assert "already complete" in second.stderr
    object_requests = {r: n - before[1].get(r, 0) for r, n in proxy.seen.items() if "/d/" in r}
    assert {r: n for r, n in object_requests.items() if n} == {f"HEAD /{bucket.name}/d/b.txt": 1}
    assert proxy.body_bytes - before[0] < 4096  # the listing's XML; no file's bytes again
    assert_identical(workspace(tmp_path, 2), files)


def test_a_changed_source_gets_a_new_entry_and_the_old_one_stays(bucket, run_initializer, tmp_path):
    cache = tmp_path / "cache"
    fill(bucket, "d", {"a.txt": b"version one"})
    env = s3_env(bucket, bucket.endpoint, "d", workspace(tmp_path, 1), CACHE_DIR=str(cache))
    assert run_initializer("dataset", env=env).code == 0
    fill(bucket, "d", {"a.txt": b"version two"})

    result = run_initializer("dataset", env={**env, "OUTPUT_PATH": str(workspace(tmp_path, 2))})

    assert result.code == 0, result.output
    entries = sorted(p for p in (cache / "entries").iterdir() if p.is_dir())
    assert len(entries) == 2
    assert (workspace(tmp_path, 1) / "a.txt").read_bytes() == b"version one"
    assert (workspace(tmp_path, 2) / "a.txt").read_bytes() == b"version two"


def test_a_caller_who_cannot_read_the_source_gets_exit_3_and_no_link_though_the_entry_exists(
    hub: HubServer, run_initializer, tmp_path
):
    hub.tokens.update({"hf_team", "hf_outsider"})
    hub.add_repo("org/gated", {"config.json": b"{}"}, gated="manual", access=["hf_team"])
    cache = tmp_path / "cache"
    env = {
        "STORAGE_URI": "hf://org/gated",
        "HF_ENDPOINT": hub.endpoint,
        "CACHE_DIR": str(cache),
    }
    allowed = run_initializer(
        "model", env={**env, "HF_TOKEN": "hf_team", "OUTPUT_PATH": str(tmp_path / "a")}
    )
    assert allowed.code == 0, allowed.output

    refused = run_initializer(
        "model", env={**env, "HF_TOKEN": "hf_outsider", "OUTPUT_PATH": str(tmp_path / "b")}
    )

    assert refused.code == 3, refused.output
    assert not (tmp_path / "b").exists() and not (tmp_path / "b").is_symlink()
    assert (the_entry(cache) / "config.json").exists()


@pytest.mark.parametrize("count", [2, 8])
def test_trainjobs_started_together_on_the_hub_fetch_each_file_once(
    count, hub: HubServer, launch, tmp_path
):
    files = dataset(65, {"model.safetensors": 4 * MIB, "config.json": 300, "tokenizer.json": 4_000})
    hub.add_repo("org/m", files)
    cache = tmp_path / "cache"
    env = {"STORAGE_URI": "hf://org/m", "HF_ENDPOINT": hub.endpoint, "CACHE_DIR": str(cache)}
    runs = [
        launch("model", env={**env, "OUTPUT_PATH": str(tmp_path / f"job{n}" / "model")})
        for n in range(count)
    ]

    assert [r.finish() for r in runs] == [0] * count, [r.stderr for r in runs]
    for n in range(count):
        assert_identical(tmp_path / f"job{n}" / "model", files)
    assert_each_hub_file_served_once(hub, files)


def test_a_new_hub_revision_gets_its_own_entry_beside_the_old_one(
    hub: HubServer, run_initializer, tmp_path
):
    hub.add_repo(
        "org/m",
        revisions={"main": {"config.json": b'{"v": 2}'}, "v1": {"config.json": b'{"v": 1}'}},
    )
    cache = tmp_path / "cache"
    env = {"HF_ENDPOINT": hub.endpoint, "CACHE_DIR": str(cache)}
    for n, uri in ((1, "hf://org/m@v1"), (2, "hf://org/m")):
        done = run_initializer(
            "model", env={**env, "STORAGE_URI": uri, "OUTPUT_PATH": str(workspace(tmp_path, n))}
        )
        assert done.code == 0, done.output

    assert len([p for p in (cache / "entries").iterdir() if p.is_dir()]) == 2
    assert (workspace(tmp_path, 1) / "config.json").read_bytes() == b'{"v": 1}'
    assert (workspace(tmp_path, 2) / "config.json").read_bytes() == b'{"v": 2}'


def test_prune_never_removes_an_entry_an_initializer_holds(
    bucket, s3_endpoint, proxies, launch, run_initializer, tmp_path
):
    cache = tmp_path / "cache"
    fill(bucket, "old", {"x.bin": b"x" * 1000})
    old = run_initializer(
        "dataset",
        env=s3_env(bucket, bucket.endpoint, "old", tmp_path / "old", CACHE_DIR=str(cache)),
    )
    assert old.code == 0, old.output
    files = dataset(66, {"a.bin": 2 * MIB})
    fill(bucket, "d", files)
    proxy = proxies(s3_endpoint)
    proxy.hold(is_object_get)
    busy = launch(
        "dataset", env=s3_env(bucket, proxy.url, "d", workspace(tmp_path, 1), CACHE_DIR=str(cache))
    )
    proxy.wait_parked(1)

    listed = cache_tool("--cache-dir", str(cache), "ls")
    pruned = cache_tool("--cache-dir", str(cache), "prune", "--max-size", "0")

    assert listed.returncode == 0 and "in use" in listed.stdout, listed
    assert pruned.returncode == 0, pruned
    assert "an initializer holds it" in pruned.stdout and "removed" in pruned.stdout
    assert not (tmp_path / "old").resolve().exists()  # the idle entry went
    proxy.release()
    assert busy.finish() == 0, busy.stderr
    assert_identical(workspace(tmp_path, 1), files)


def test_hostile_cache_contents_are_repaired_and_nothing_outside_is_written(
    bucket, run_initializer, tmp_path
):
    files = dataset(67, {"a.bin": 1 * MIB, "b/c.txt": 100, "d.txt": 50})
    fill(bucket, "d", files)
    cache = tmp_path / "cache"
    env = s3_env(bucket, bucket.endpoint, "d", workspace(tmp_path, 1), CACHE_DIR=str(cache))
    assert run_initializer("dataset", env=env).code == 0
    entry = the_entry(cache)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_bytes(b"keep me")
    (entry / "a.bin").unlink()
    (entry / "a.bin").symlink_to(outside / "precious")  # a planted symlink
    with open(entry / "d.txt", "r+b") as f:  # a truncated file
        f.truncate(10)
    manifest = json.loads((entry / MANIFEST_NAME).read_text())  # a forged record
    manifest["files"]["b/c.txt"]["size"] = 99
    (entry / MANIFEST_NAME).write_text(json.dumps(manifest))

    result = run_initializer("dataset", env={**env, "OUTPUT_PATH": str(workspace(tmp_path, 2))})

    assert result.code == 0, result.output
    assert_identical(workspace(tmp_path, 2), files)
    assert (outside / "precious").read_bytes() == b"keep me"
    assert sorted(p.name for p in outside.iterdir()) == ["precious"]
    assert find_problems(workspace(tmp_path, 2)) == []


def test_an_entry_replaced_by_a_symlink_is_rebuilt_inside_the_cache(
    bucket, run_initializer, tmp_path
):
    files = dataset(68, {"a.bin": 100_000})
    fill(bucket, "d", files)
    cache = tmp_path / "cache"
    env = s3_env(bucket, bucket.endpoint, "d", workspace(tmp_path, 1), CACHE_DIR=str(cache))
    assert run_initializer("dataset", env=env).code == 0
    entry = the_entry(cache)
    elsewhere = tmp_path / "elsewhere"
    entry.rename(elsewhere)
    entry.symlink_to(elsewhere)

    result = run_initializer("dataset", env=env)

    assert result.code == 0, result.output
    assert entry.is_dir() and not entry.is_symlink()
    assert workspace(tmp_path, 1).resolve() == entry.resolve()
    assert_identical(workspace(tmp_path, 1), files)


def test_an_output_folder_with_files_in_it_is_refused_and_kept(bucket, run_initializer, tmp_path):
    fill(bucket, "d", {"a.txt": b"a"})
    out = workspace(tmp_path, 1)
    out.mkdir(parents=True)
    (out / "mine.txt").write_text("user data")

    result = run_initializer(
        "dataset", env=s3_env(bucket, bucket.endpoint, "d", out, CACHE_DIR=str(tmp_path / "c"))
    )

    assert result.code == 6, result.output
    assert "is a folder with files in it" in result.stderr and "CACHE_DIR" in result.stderr
    assert (out / "mine.txt").read_text() == "user data"


def test_a_trainer_without_the_cache_mounted_is_told_to_mount_it(tmp_path):
    link = tmp_path / "model"
    link.symlink_to(tmp_path / "cache-not-mounted" / "entries" / "x")

    problems = find_problems(link)

    assert len(problems) == 1 and "mount the cache volume" in problems[0]


def _entry(name: str, size: int, last_used: float, held_by: str = "") -> EntryInfo:
    return EntryInfo(name, "s3://b/p", None, size, 1, True, last_used, held_by)


def test_prune_takes_the_least_recently_used_first_and_stops_when_the_rest_fits():
    entries = [_entry("new", 5, 300), _entry("old", 5, 100), _entry("mid", 5, 200)]

    chosen = to_prune(entries, max_size=10, older_than=None, now=400)

    assert [e.name for e in chosen] == ["old"]


def test_prune_by_age_skips_held_entries():
    entries = [
        _entry("idle", 5, 0),
        _entry("held", 5, 0, held_by="a training"),
        _entry("recent", 5, 990),
    ]

    chosen = to_prune(entries, max_size=None, older_than=100, now=1000)

    assert [e.name for e in chosen] == ["idle"]


def test_sizes_and_durations_read_as_operators_write_them():
    assert parse_size("500GiB") == 500 << 30
    assert parse_size("2T") == 2 << 40
    assert parse_size("1000") == 1000
    assert parse_duration("7d") == 7 * 86400
    assert parse_duration("12h") == 43200


def test_ls_shows_entries_without_secrets(bucket, run_initializer, tmp_path):
    fill(bucket, "d", {"a.txt": b"a"})
    cache = tmp_path / "cache"
    env = s3_env(bucket, bucket.endpoint, "d", workspace(tmp_path, 1), CACHE_DIR=str(cache))
    assert run_initializer("dataset", env=env).code == 0

    listed = cache_tool("--cache-dir", str(cache), "ls", "--json")

    assert listed.returncode == 0, listed
    (row,) = [json.loads(line) for line in listed.stdout.splitlines()]
    assert row["source"] == f"s3://{bucket.name}/d" and row["state"] == "complete"
    assert env["SECRET_ACCESS_KEY"] not in listed.stdout + listed.stderr
    assert AssetCache(cache).entries()[0].files == 1


def test_prune_leaves_an_entry_alone_while_a_training_reads_it_through_the_shim(
    bucket, run_initializer, tmp_path
):
    fill(bucket, "d", {"a.txt": b"weights"})
    cache = tmp_path / "cache"
    model = workspace(tmp_path, 1)
    env = s3_env(bucket, bucket.endpoint, "d", model, CACHE_DIR=str(cache))
    assert run_initializer("dataset", env=env).code == 0
    # What the launcher shims do: check the assets, then exec the training, which inherits
    # the entry's shared hold.
    training = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import os, sys; from pathlib import Path; "
            "from initializers.launchers.assets import wait_for_assets; "
            "wait_for_assets([Path(sys.argv[1])], 10); print('ready', flush=True); "
            "os.execvp('sleep', ['sleep', '60'])",
            str(model),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert training.stdout is not None and training.stdout.readline() == "ready\n"
        time.sleep(0.2)  # the exec itself

        while_training = cache_tool("--cache-dir", str(cache), "prune", "--max-size", "0")

        assert "a training holds it" in while_training.stdout, while_training
        assert (model / "a.txt").read_bytes() == b"weights"
    finally:
        training.kill()
        training.wait()
    after = cache_tool("--cache-dir", str(cache), "prune", "--max-size", "0")
    assert "removed" in after.stdout, after
    assert not model.exists()  # the link now leads nowhere: the entry is gone


def test_a_waiter_gives_up_with_exit_7_when_the_holder_makes_no_progress(
    bucket, s3_endpoint, proxies, launch, tmp_path
):
    files = dataset(69, {"a.bin": 2 * MIB})
    fill(bucket, "d", files)
    proxy = proxies(s3_endpoint)
    cache = tmp_path / "cache"
    proxy.hold(is_object_get)  # the holder's GETs go nowhere: a stuck holder
    holder = launch(
        "dataset", env=s3_env(bucket, proxy.url, "d", workspace(tmp_path, 1), CACHE_DIR=str(cache))
    )
    proxy.wait_parked(1)
    # --timeout 0.5: the waiter's bound is ten times that without progress.
    waiter = launch(
        "dataset",
        env=s3_env(
            bucket, proxy.url, "d", workspace(tmp_path, 2), CACHE_DIR=str(cache), TIMEOUT="0.5"
        ),
    )

    assert waiter.finish(timeout=60) == 7, waiter.stderr
    assert "no progress for 5s" in waiter.stderr
    assert not workspace(tmp_path, 2).exists()
    proxy.release()
    assert holder.finish() == 0, holder.stderr
    assert_identical(workspace(tmp_path, 1), files)

"""Runs of many small files are shared with forked worker processes: they must behave as one.

The real CLI fetches a few hundred small files (and one file in parallel ranges, which the
parent keeps) through a proxy, so faults, holds and signals reach the children's requests too.
A child's files, progress and failures come back to the parent; a stop or a kill of the parent
leaves no process behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path

import pytest

from initializers import processes
from initializers.manifest import find_problems
from tests.reliability.conftest import (
    FIGURES,
    assert_identical,
    dataset,
    fill,
    is_object_get,
    s3_env,
)
from tests.servers.faultproxy import Fault, every_fault

MIB = 1 << 20
SMALL = 300
FILES = {
    "big/weights.safetensors": 72 * MIB,  # three ranges, fetched by the parent
    **{f"rows/part-{i:03d}.jsonl": 2_000 + i * 97 for i in range(SMALL)},
}
PROCESSES = processes.process_count(SMALL, workers=8)

needs_two_cpus = pytest.mark.skipif(PROCESSES < 2, reason="one usable CPU: no worker processes")


def processes_writing_to(out: Path) -> list[int]:
    """PIDs of live processes whose environment points OUTPUT_PATH at ``out``."""
    marker = f"OUTPUT_PATH={out}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if marker in (entry / "environ").read_bytes().split(b"\0"):
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state != "Z":  # a zombie has finished; only its parent's wait is missing
                    found.append(int(entry.name))
    return found


def wait_until_gone(out: Path, seconds: float = 5.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while (left := processes_writing_to(out)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def start_fetch(seed, bucket, s3_endpoint, proxies, launch, tmp_path):
    """The CLI started on seeded FILES through a fault-free proxy, once it logs its plan:
    ``(files, proxy, out, env, live)``."""
    files = dataset(seed, FILES)
    fill(bucket, "d", files)
    proxy = proxies(s3_endpoint)
    out = tmp_path / "out"
    env = s3_env(bucket, proxy.url, "d", out, WORKERS="8")
    live = launch("dataset", env=env)
    live.wait_for(": fetching ")
    return files, proxy, out, env, live


@needs_two_cpus
def test_many_small_files_are_shared_by_worker_processes_through_faults_and_come_out_whole(
    stable_bucket, s3_endpoint, proxies, run_initializer, tmp_path
):
    files = dataset(41, FILES)
    fill(stable_bucket, "d", files)
    proxy = proxies(s3_endpoint, seed=41, share=0.1, faults=every_fault(stall_seconds=30))
    out = tmp_path / "out"
    env = s3_env(stable_bucket, proxy.url, "d", out, TIMEOUT="1", WORKERS="8", DEBUG="1")
    result = run_initializer("dataset", env=env)

    assert result.code == 0, result.output
    assert f"{PROCESSES} worker processes share {SMALL} files" in result.stderr
    assert f"done — {len(files)} fetched" in result.stderr
    assert_identical(out, files)
    assert find_problems(out) == []
    manifest = json.loads((out / ".initializer-manifest.json").read_text())
    assert set(manifest["files"]) == set(files)
    assert proxy.total_injected > 0 and "Traceback" not in result.stderr
    assert processes_writing_to(out) == []


@needs_two_cpus
@pytest.mark.parametrize("digit", ["0", "1"], ids=["even files", "odd files"])
def test_a_refusal_met_in_either_share_ends_the_run_with_exit_3_and_one_clear_line(
    digit, bucket, s3_endpoint, proxies, run_initializer, tmp_path
):
    # Files are dealt to the processes in size order, so even- and odd-numbered files land in
    # different shares: each case meets the refusal in a different process.
    files = dataset(43, FILES)
    fill(bucket, "d", files)
    proxy = proxies(s3_endpoint)

    def refused(request):
        return is_object_get(request) and request.path.endswith(f"{digit}.jsonl")

    proxy.force(Fault.error(403), times=10_000, match=refused)
    out = tmp_path / "out"
    result = run_initializer("dataset", env=s3_env(bucket, proxy.url, "d", out, WORKERS="8"))

    assert result.code == 3, result.output
    errors = [line for line in result.stderr.splitlines() if "access denied" in line]
    assert len(errors) == 1, result.stderr
    assert "check the credentials" in errors[0] and f"{digit}.jsonl" in errors[0]
    assert "Traceback" not in result.stderr
    assert not any((out / name).exists() for name in files if name.endswith(f"{digit}.jsonl"))
    assert not (out / ".initializer-manifest.json").exists()
    assert processes_writing_to(out) == []


@needs_two_cpus
@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
def test_stopping_the_parent_mid_fetch_leaves_no_worker_process_and_the_rerun_completes(
    how, bucket, s3_endpoint, proxies, launch, run_initializer, tmp_path
):
    files, proxy, out, env, live = start_fetch(47, bucket, s3_endpoint, proxies, launch, tmp_path)
    while proxy.body_bytes < 8 * MIB:  # well into the fetch, children included
        time.sleep(0.01)
    assert len(processes_writing_to(out)) == PROCESSES  # the parent and its children
    proxy.hold(is_object_get)  # requests now hang: a child can only end by being stopped
    live.signal(getattr(signal, how))
    code = live.finish(timeout=30)
    left = wait_until_gone(out)
    proxy.release()

    assert code == (143 if how == "SIGTERM" else -9), live.stderr
    assert left == [], "a worker process outlived its parent"
    assert not (out / ".initializer-manifest.json").exists()
    if how == "SIGTERM":
        assert "rerun to resume" in live.stderr and "Traceback" not in live.stderr
    rerun = run_initializer("dataset", env=env)
    assert rerun.code == 0, rerun.output
    assert_identical(out, files)
    assert find_problems(out) == []
    FIGURES[f"{how}s of a multi-process fetch survived"] += 1


@needs_two_cpus
def test_a_worker_process_killed_mid_fetch_fails_the_run_with_one_line_naming_the_signal(
    bucket, s3_endpoint, proxies, launch, run_initializer, tmp_path
):
    files, proxy, out, env, live = start_fetch(59, bucket, s3_endpoint, proxies, launch, tmp_path)
    proxy.hold(is_object_get)  # everyone waits on a request: the kill lands mid-fetch
    proxy.wait_parked(1)
    children = [pid for pid in processes_writing_to(out) if pid != live.proc.pid]
    assert children, "no worker process to kill"
    os.kill(children[0], signal.SIGKILL)  # what the kernel's OOM killer does
    code = live.finish(timeout=30)
    proxy.release()

    assert code == 1, live.stderr
    assert "a worker process was killed by SIGKILL before reporting" in live.stderr
    assert "rerun to resume" in live.stderr and "Traceback" not in live.stderr
    assert wait_until_gone(out) == []
    rerun = run_initializer("dataset", env=env)
    assert rerun.code == 0, rerun.output
    assert_identical(out, files)
    FIGURES["SIGKILLs of a worker process survived"] += 1


def test_a_few_files_are_fetched_by_threads_alone(bucket, s3_endpoint, run_initializer, tmp_path):
    few = dataset(53, {f"f-{i}.txt": 100 + i for i in range(processes.FILES_PER_PROCESS)})
    fill(bucket, "d", few)
    out = tmp_path / "out"
    result = run_initializer("dataset", env=s3_env(bucket, s3_endpoint, "d", out, DEBUG="1"))

    assert result.code == 0, result.output
    assert "worker processes" not in result.stderr
    assert_identical(out, few)


def test_the_process_count_follows_the_usable_cpus_and_the_file_count(monkeypatch):
    monkeypatch.setattr(processes, "_fork_forbidden", False)  # another spec built a native client
    cpus = processes.usable_cpus()
    assert 1 <= cpus <= len(os.sched_getaffinity(0))
    assert processes.process_count(0, workers=16) == 1
    assert processes.process_count(processes.FILES_PER_PROCESS - 1, workers=16) == 1
    many = processes.FILES_PER_PROCESS * 100
    assert processes.process_count(many, workers=16) == min(processes.MAX_PROCESSES, cpus)
    assert processes.process_count(many, workers=1) == 1  # never more processes than requests

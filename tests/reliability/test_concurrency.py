"""Two pods on one ReadWriteMany volume: the destination lock makes them take turns.

The proxy parks the first initializer's object requests, so the second one is guaranteed to
arrive while the first holds the lock, whatever the machine's speed.
"""

from __future__ import annotations

import multiprocessing
import signal
import time
from pathlib import Path

import pytest

from initializers.fsutil import atomic_write_bytes
from initializers.manifest import find_problems
from tests.reliability.conftest import (
    FIGURES,
    Live,
    assert_identical,
    dataset,
    fill,
    is_object_get,
    one_manifest,
    s3_env,
)

MIB = 1 << 20
WAITING = "another initializer is working on"


def holder_and_waiter(launch, proxy, env: dict[str, str]) -> tuple[Live, Live]:
    """Start an initializer whose object GETs the proxy parks (so it holds the lock), then a
    second one on the same destination, and return both once the second says it is waiting."""
    proxy.hold(is_object_get)
    holder = launch("dataset", env=env)
    proxy.wait_parked(1)
    waiter = launch("dataset", env=env)
    waiter.wait_for(WAITING)
    return holder, waiter


def test_two_initializers_started_together_end_with_one_complete_tree_fetched_once(
    bucket, s3_endpoint, proxies, launch, tmp_path
):
    files = dataset(31, {"a.bin": 6 * MIB, "b/c.json": 1_000, "d.txt": 20_000})
    fill(bucket, "d", files)
    proxy = proxies(s3_endpoint)
    proxy.hold(is_object_get)
    out = tmp_path / "shared-volume"
    env = s3_env(bucket, proxy.url, "d", out)
    first, second = launch("dataset", env=env), launch("dataset", env=env)
    proxy.wait_parked(1)  # one of them holds the lock and is fetching
    waiter = None
    deadline = time.monotonic() + 30
    while waiter is None and time.monotonic() < deadline:
        waiter = next((p for p in (first, second) if WAITING in p.stderr), None)
        time.sleep(0.01)
    assert waiter is not None, first.stderr + second.stderr
    proxy.release()

    assert first.finish() == 0, first.stderr
    assert second.finish() == 0, second.stderr
    assert "already complete" in waiter.stderr and "nothing to fetch" in waiter.stderr
    assert_identical(out, files)
    assert set(one_manifest(out)["files"]) == set(files)
    assert find_problems(out) == []
    # Each object crossed the network once: the waiter found the work done.
    assert all(proxy.seen[f"GET /{bucket.name}/d/{name}"] == 1 for name in files), proxy.seen


def test_the_waiting_initializer_finishes_the_fetch_when_the_first_is_killed(
    bucket, s3_endpoint, proxies, launch, tmp_path
):
    files = dataset(32, {"a.bin": 12 * MIB, "b.json": 2_000})
    fill(bucket, "d", files)
    proxy = proxies(s3_endpoint)
    out = tmp_path / "shared-volume"
    first, second = holder_and_waiter(launch, proxy, s3_env(bucket, proxy.url, "d", out))
    first.kill()  # the pod holding the lock dies; the kernel drops its flock
    proxy.release()

    assert second.finish() == 0, second.stderr
    assert_identical(out, files)
    assert set(one_manifest(out)["files"]) == set(files)
    FIGURES["SIGKILLs survived (the lock holder)"] += 1


def test_sigterm_while_waiting_for_the_lock_exits_143_promptly(
    bucket, s3_endpoint, proxies, launch, tmp_path
):
    files = dataset(33, {"a.bin": 2 * MIB})
    fill(bucket, "d", files)
    proxy = proxies(s3_endpoint)
    out = tmp_path / "shared-volume"
    first, second = holder_and_waiter(launch, proxy, s3_env(bucket, proxy.url, "d", out))
    stopped_at = time.monotonic()
    second.signal(signal.SIGTERM)
    assert second.finish(timeout=30) == 143, second.stderr
    assert time.monotonic() - stopped_at < 5  # without waiting for the lock holder
    assert "rerun to resume" in second.stderr
    FIGURES["SIGTERMs survived"] += 1
    proxy.release()
    assert first.finish() == 0, first.stderr
    assert_identical(out, files)


def _write_records(target: Path, writer: int, rounds: int) -> None:
    for round_ in range(rounds):
        atomic_write_bytes(target, bytes([writer]) * 50_000 + round_.to_bytes(4, "big"))


def test_writers_recording_one_file_together_all_succeed_and_leave_one_whole_file(tmp_path):
    # The shards of one cache entry record its use at the same moment, under a shared lock.
    target = tmp_path / ".initializer-cache.json"
    context = multiprocessing.get_context("fork")
    writers = [context.Process(target=_write_records, args=(target, n, 200)) for n in range(1, 5)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(60)
    assert [w.exitcode for w in writers] == [0, 0, 0, 0]
    body = target.read_bytes()
    assert len(body) == 50_004 and body[:50_000] == body[:1] * 50_000
    assert sorted(p.name for p in tmp_path.iterdir()) == [target.name]


@pytest.mark.parametrize("engine_running", [True, False], ids=["fetching", "before-fetching"])
def test_a_sigterm_that_lands_while_stderr_is_mid_write_still_stops_the_run(
    engine_running, monkeypatch
):
    # Seen in CI: the signal arrived while this thread was writing a log line, the handler's
    # own log line raised "reentrant call", and the stop was lost: the run waited on.
    from initializers import cli

    def reentrant(*args: object, **kwargs: object) -> None:
        raise RuntimeError("reentrant call inside <_io.BufferedWriter name='<stderr>'>")

    cut: list[bool] = []
    monkeypatch.setattr(cli.log, "warning", reentrant)
    monkeypatch.setattr(cli, "interrupt_reads", lambda: cut.append(True))
    stop = cli._StopOnSignal()
    stop.engine_running = engine_running
    if engine_running:
        stop._handle(signal.SIGTERM, None)
    else:
        with pytest.raises(cli.Interrupted):
            stop._handle(signal.SIGTERM, None)
    assert stop.event.is_set()
    assert cut == ([True] if engine_running else [])

"""A bad network, injected for real by a proxy between the initializer and the S3 / Hub servers.

Each random-fault run breaks a seeded share of the requests of a multi-file, multi-range fetch
with every kind of fault (reset mid-body, 500, 503, S3 SlowDown, short body, stall before and
during the body, the server going away for a moment); the tree must come out byte-identical,
with every retry bounded. A source that never recovers must end with exit 7, not a hang.
"""

from __future__ import annotations

import email.utils
import re
import time

import pytest

from initializers.inflight import SMALL_BODY
from initializers.manifest import find_problems
from tests.reliability.conftest import (
    FIGURES,
    assert_identical,
    dataset,
    fill,
    is_object_get,
    retry_lines,
    s3_env,
)
from tests.servers.faultproxy import Fault, every_fault
from tests.servers.hub import HubServer

MIB = 1 << 20
TOKEN = "hf_reliability_token_7c41"
KINDS = {fault.label for fault in every_fault()}
S3_FILES = {
    "big/weights.safetensors": 72 * MIB,  # three 24 MiB ranges
    "mid/shard.bin": 20 * MIB,  # one resumable range
    **{f"small/part-{i:02d}.jsonl": 1_000 + i * 9_000 for i in range(24)},
}


def attempts(stderr: str) -> list[int]:
    return [int(n) for n in re.findall(r"\(attempt (\d+)\)", stderr)]


def test_random_faults_on_a_multi_file_multi_range_s3_fetch_leave_a_byte_identical_tree(
    stable_bucket, s3_endpoint, proxies, run_initializer, tmp_path
):
    bucket = stable_bucket
    files = dataset(11, S3_FILES)
    fill(bucket, "d", files)
    proxy = proxies(s3_endpoint, seed=2000, share=0.3, faults=every_fault(stall_seconds=30))
    out = tmp_path / "out"
    started = time.monotonic()
    result = run_initializer(
        "dataset", env=s3_env(bucket, proxy.url, "d", out, TIMEOUT="1", WORKERS="8")
    )
    elapsed = time.monotonic() - started

    assert result.code == 0, result.output
    assert_identical(out, files)
    assert find_problems(out) == []
    assert set(proxy.injected) == KINDS, proxy.injected
    # Every injected fault was seen by the client and retried; none used up the budget.
    assert len(retry_lines(result.stderr)) >= proxy.total_injected, result.stderr
    assert max(attempts(result.stderr)) < 8
    assert elapsed < 90, f"{elapsed:.0f}s"
    FIGURES["retries logged by the S3 random-fault run"] += len(retry_lines(result.stderr))


def test_random_faults_on_the_hub_api_and_cdn_leave_a_byte_identical_tree(
    hub: HubServer, proxies, run_initializer, tmp_path
):
    files = dataset(
        12,
        {
            "data/train-00000.parquet": 60 * MIB,  # LFS via the CDN, two ranges
            "data/train-00001.parquet": 12 * MIB,
            **{f"meta/part-{i:02d}.jsonl": 500 + i * 7_000 for i in range(16)},  # via resolve
        },
    )
    hub.tokens.add(TOKEN)
    hub.add_repo("org/data", files, repo_type="dataset", private=True)
    faults = every_fault(stall_seconds=30)
    # The CDN sees few requests: it takes the kinds in the opposite order, so that between
    # them the two proxies inject every kind.
    cdn = proxies(hub.cdn_endpoint, seed=5, share=0.4, faults=faults[::-1])
    api = proxies(
        hub.endpoint,
        seed=6,
        share=0.3,
        faults=faults,
        rewrite_location={hub.cdn_endpoint: cdn.url},
    )
    out = tmp_path / "out"
    env = {
        "STORAGE_URI": "hf://datasets/org/data",
        "HF_ENDPOINT": api.url,
        "ACCESS_TOKEN": TOKEN,
        "OUTPUT_PATH": str(out),
        "TIMEOUT": "1",
    }
    started = time.monotonic()
    result = run_initializer("dataset", env=env)
    elapsed = time.monotonic() - started

    assert result.code == 0, result.output
    assert_identical(out, files)
    assert find_problems(out) == []
    assert cdn.total_injected and api.total_injected
    assert set(cdn.injected) | set(api.injected) == KINDS
    assert hub.find_requests(server="cdn", method="GET"), "LFS bytes must come from the CDN"
    assert elapsed < 90, f"{elapsed:.0f}s"


def test_a_server_that_goes_away_for_two_seconds_mid_fetch_and_comes_back(
    bucket, s3_endpoint, proxies, run_initializer, tmp_path
):
    files = dataset(13, {"a.bin": 3 * MIB, "b.bin": 2 * MIB, "c.bin": MIB})
    fill(bucket, "d", files)
    proxy = proxies(s3_endpoint)
    proxy.force(Fault.outage(2.0), match=is_object_get)
    out = tmp_path / "out"
    started = time.monotonic()
    result = run_initializer("dataset", env=s3_env(bucket, proxy.url, "d", out, TIMEOUT="1"))
    elapsed = time.monotonic() - started

    assert result.code == 0, result.output
    assert_identical(out, files)
    assert proxy.injected == {"outage": 1}
    assert "cannot connect to the server (Connection refused)" in result.stderr, result.stderr
    assert elapsed >= 2.0  # it really waited the outage out


def test_a_link_that_drops_every_two_mib_still_finishes_a_range_longer_than_the_budget(
    bucket, s3_endpoint, proxies, run_initializer, tmp_path
):
    # Six bodies cut short, three attempts allowed: every attempt got 2 MiB further, so none of
    # the breaks counts against the budget of the next one. (A short body, not a reset: an RST
    # makes the kernel drop what the client had not read yet, so the progress would vary.)
    files = dataset(14, {"shard.bin": 20 * MIB})
    fill(bucket, "d", files)
    proxy = proxies(s3_endpoint)
    proxy.force(Fault.short(2 * MIB), times=6, match=is_object_get)
    out = tmp_path / "out"
    result = run_initializer("dataset", env=s3_env(bucket, proxy.url, "d", out, RETRIES="3"))

    assert result.code == 0, result.output
    assert_identical(out, files)
    assert proxy.injected == {"short": 6}
    assert len(retry_lines(result.stderr)) == 6, result.stderr
    assert max(attempts(result.stderr)) == 1  # each retry began a new streak
    assert proxy.body_bytes < 21 * MIB  # each attempt resumed from the byte it reached


def test_a_link_that_breaks_before_a_mib_each_time_ends_with_exit_7_after_the_budget(
    bucket, s3_endpoint, proxies, run_initializer, tmp_path
):
    # 256 KiB an attempt is not progress enough to earn a new budget: a source that crawls and
    # breaks forever is treated as down, in RETRIES attempts, not served for hours.
    fill(bucket, "d", dataset(15, {"shard.bin": 20 * MIB}))
    proxy = proxies(s3_endpoint)
    proxy.force(Fault.reset(256 * 1024), times=10_000, match=is_object_get)
    result = run_initializer(
        "dataset", env=s3_env(bucket, proxy.url, "d", tmp_path / "out", RETRIES="3")
    )

    assert result.code == 7, result.output
    assert "still failing after 3 attempts" in result.stderr, result.stderr
    assert proxy.injected == {"reset": 3}


def test_the_retry_after_an_error_status_is_not_spoiled_by_the_connection_that_carried_it(
    bucket, s3_endpoint, hub, proxies, run_initializer, tmp_path
):
    # The proxy keeps the connection open after its 503, as S3 does. An error body left unread
    # on a pooled connection made the next request on it fail too (http.client's
    # ResponseNotReady), so one 503 cost two attempts: with RETRIES=2, the run.
    fill(bucket, "d", dataset(16, {"a.bin": 3 * MIB}))
    s3 = proxies(s3_endpoint)
    s3.force(Fault.error(503), match=is_object_get)
    hub.add_repo("org/m", dataset(17, {"model.safetensors": 3 * MIB}))
    api = proxies(hub.endpoint)
    api.force(Fault.error(500), match=lambda r: "/resolve/" in r.path)
    runs = {
        "s3": s3_env(bucket, s3.url, "d", tmp_path / "s3", RETRIES="2", WORKERS="1"),
        "hub": {
            "STORAGE_URI": "hf://org/m",
            "HF_ENDPOINT": api.url,
            "OUTPUT_PATH": str(tmp_path / "hub"),
            "RETRIES": "2",
            "WORKERS": "1",
        },
    }
    for name, env in runs.items():
        result = run_initializer("model" if name == "hub" else "dataset", env=env)
        assert result.code == 0, f"{name}: {result.output}"
        assert len(retry_lines(result.stderr)) == 1, f"{name}: {result.stderr}"
    assert s3.injected == {"error-503": 1} and api.injected == {"error-500": 1}


def test_an_endpoint_answering_every_request_with_503_exits_7_after_exactly_the_retry_budget(
    bucket, s3_endpoint, proxies, run_initializer, tmp_path
):
    fill(bucket, "d", {"a.txt": b"a"})
    proxy = proxies(s3_endpoint, share=1.0, faults=[Fault.error(503)], max_in_a_row=10**9)
    started = time.monotonic()
    result = run_initializer(
        "dataset", env=s3_env(bucket, proxy.url, "d", tmp_path / "out", RETRIES="3")
    )
    assert result.code == 7, result.output
    assert "still failing after 3 attempts" in result.stderr
    assert proxy.requests == 3  # no hidden retries underneath ours
    assert time.monotonic() - started < 30
    assert "Traceback" not in result.output


def test_s3_slowdown_on_every_object_exits_7_with_the_throttling_named(
    bucket, s3_endpoint, proxies, run_initializer, tmp_path
):
    fill(bucket, "d", {"a.txt": b"a"})
    proxy = proxies(
        s3_endpoint, share=1.0, faults=[Fault.slowdown()], match=is_object_get, max_in_a_row=10**9
    )
    result = run_initializer(
        "dataset", env=s3_env(bucket, proxy.url, "d", tmp_path / "out", RETRIES="2")
    )
    assert result.code == 7, result.output
    assert "a.txt: HTTP 503" in result.stderr
    assert proxy.injected == {"slowdown": 2}


def test_s3_slowdown_with_retry_after_waits_what_the_server_asked_then_completes(
    bucket, s3_endpoint, proxies, run_initializer, tmp_path
):
    fill(bucket, "d", {"a.txt": b"a"})
    proxy = proxies(s3_endpoint)
    proxy.force(Fault.slowdown(retry_after="3"), match=is_object_get)
    started = time.monotonic()
    result = run_initializer("dataset", env=s3_env(bucket, proxy.url, "d", tmp_path / "out"))
    assert result.code == 0, result.output
    assert "retrying in 3.0s (attempt 1)" in result.stderr
    assert "asked to retry after 3s" in result.stderr
    assert time.monotonic() - started >= 3  # a wait cannot be shorter than it was
    assert proxy.injected == {"slowdown": 1}


def test_a_hub_rate_limit_with_an_http_date_waits_until_then(
    hub: HubServer, proxies, run_initializer, tmp_path
):
    hub.add_repo("org/m", {"config.json": b"{}"})
    proxy = proxies(hub.endpoint)
    # Whole seconds, as an HTTP date has them; far enough ahead for a slow start to reach it.
    until = int(time.time()) + 5
    proxy.force(
        Fault.error(429, retry_after=email.utils.formatdate(until, usegmt=True)),
        match=lambda request: request.method == "GET" and "/resolve/" in request.path,
    )
    started = time.monotonic()
    result = run_initializer(
        "model",
        env={
            "STORAGE_URI": "hf://org/m",
            "HF_ENDPOINT": proxy.url,
            "OUTPUT_PATH": str(tmp_path / "m"),
        },
    )
    assert result.code == 0, result.output
    assert proxy.injected == {"error-429": 1}
    assert re.search(r"retrying in [0-5]\.\d+s \(attempt 1\)", result.stderr), result.stderr
    # The retry waited for the date (how long that was depends on how fast the run started: on
    # a slow machine the 429 came 1.1 s after the date was made, and the wait was 1.9 s).
    assert time.time() >= until - 0.1
    assert time.monotonic() - started >= 1


@pytest.mark.parametrize("after_bytes", [None, 50_000], ids=["before-headers", "mid-body"])
def test_an_object_that_always_stalls_exits_7_instead_of_hanging(
    after_bytes, bucket, s3_endpoint, proxies, launch, tmp_path
):
    fill(bucket, "d", {"a.bin": b"x" * 100_000})
    stall = Fault.stall(600, after_bytes=after_bytes)
    proxy = proxies(s3_endpoint, share=1.0, faults=[stall], match=is_object_get, max_in_a_row=10**9)
    live = launch(
        "dataset", env=s3_env(bucket, proxy.url, "d", tmp_path / "out", TIMEOUT="1", RETRIES="2")
    )
    code = live.finish(timeout=60)
    assert code == 7, live.stderr
    assert "stalled past the timeout" in live.stderr
    assert proxy.injected == {stall.label: 2}
    assert live.seconds < 30


def test_a_hub_api_that_stalls_exits_7_instead_of_hanging(hub, proxies, launch, tmp_path):
    hub.add_repo("org/m", {"config.json": b"{}"})
    proxy = proxies(hub.endpoint, share=1.0, faults=[Fault.stall(600)], max_in_a_row=10**9)
    env = {
        "STORAGE_URI": "hf://org/m",
        "HF_ENDPOINT": proxy.url,
        "OUTPUT_PATH": str(tmp_path / "out"),
        "TIMEOUT": "1",
        "RETRIES": "2",
    }
    live = launch("model", env=env)
    code = live.finish(timeout=60)
    assert code == 7, live.stderr
    assert "still failing after 2 attempts" in live.stderr
    assert live.seconds < 30


def test_files_verified_before_a_final_refusal_are_committed_and_not_fetched_again(
    bucket, s3_endpoint, proxies, run_initializer, tmp_path
):
    # Largest first, one worker, no small file (small ones get more requests than workers): the
    # refused file comes last, when the others are verified and waiting for their group commit;
    # the refusal must not throw that work away. (With two requests in flight the last of the
    # others may still be in flight, and rightly be dropped.)
    sizes = {f"part-{i}.bin": 2 * MIB + i for i in range(10)} | {"z.bin": SMALL_BODY + 1}
    files = dataset(47, sizes)
    fill(bucket, "d", files)
    proxy = proxies(s3_endpoint)
    proxy.force(
        Fault.error(403), times=10_000, match=lambda r: is_object_get(r) and "z.bin" in r.path
    )
    out = tmp_path / "out"
    env = s3_env(bucket, proxy.url, "d", out, WORKERS="1")
    failed = run_initializer("dataset", env=env)
    assert failed.code == 3, failed.output
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == sorted(
        name for name in files if name != "z.bin"
    )

    rerun = run_initializer("dataset", env=s3_env(bucket, s3_endpoint, "d", out))
    assert rerun.code == 0, rerun.output
    assert "fetching 1 of 11 files" in rerun.stderr, rerun.stderr
    assert_identical(out, files)

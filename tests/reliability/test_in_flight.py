"""How many requests a run keeps in flight: many for small files, each of which mostly waits for
its first byte (10-50 ms from S3 or a CDN), and as many as the workers for large ranges, each of
which is bandwidth and a buffer. The proxy parks every object GET, so what it holds at once is
what the initializer has in flight."""

from __future__ import annotations

import time

from initializers.inflight import LOOP_PER_WORKER, TINY_BODY, loop_in_flight
from tests.reliability.conftest import assert_identical, dataset, fill, is_object_get, s3_env

MIB = 1 << 20
WORKERS = 2
SETTLE = 0.5  # seconds for one more request to arrive, were it sent


def held_at_once(bucket, s3_endpoint, proxies, launch, tmp_path, files, expected):
    """Run a fetch of ``files`` whose GETs are parked; the number parked once it settles."""
    fill(bucket, "d", files)
    proxy = proxies(s3_endpoint)
    proxy.hold(is_object_get)
    out = tmp_path / "out"
    run = launch("dataset", env=s3_env(bucket, proxy.url, "d", out, WORKERS=str(WORKERS)))
    try:
        proxy.wait_parked(expected)
        time.sleep(SETTLE)
        parked = proxy.parked
    finally:
        proxy.release()
    assert run.finish() == 0, run.stderr
    assert_identical(out, files)
    return parked


def test_small_files_keep_several_times_the_workers_requests_in_flight(
    bucket, s3_endpoint, proxies, launch, tmp_path
):
    files = dataset(41, {f"shards/{i:02d}.jsonl": TINY_BODY + 1000 + i for i in range(24)})
    expected = WORKERS * LOOP_PER_WORKER  # on the native loop, where they cost no thread
    assert held_at_once(bucket, s3_endpoint, proxies, launch, tmp_path, files, expected) == expected


def test_tiny_files_keep_four_times_as_many_in_flight(
    bucket, s3_endpoint, proxies, launch, tmp_path
):
    # Objects of a few KiB are nothing but their wait for the first byte.
    files = dataset(44, {f"images/{i:02d}.jpg": 2_000 + i for i in range(48)})
    expected = 4 * WORKERS * LOOP_PER_WORKER
    assert loop_in_flight(WORKERS, [len(data) for data in files.values()]) == expected
    assert held_at_once(bucket, s3_endpoint, proxies, launch, tmp_path, files, expected) == expected


def test_large_ranges_keep_only_the_workers_requests_in_flight(
    bucket, s3_endpoint, proxies, launch, tmp_path
):
    files = dataset(42, {f"weights/{i}.bin": 2 * MIB + i for i in range(6)})
    assert held_at_once(bucket, s3_endpoint, proxies, launch, tmp_path, files, WORKERS) == WORKERS


def test_requests_reuse_kept_alive_connections_instead_of_one_per_request(
    bucket, s3_endpoint, proxies, launch, tmp_path
):
    # A pool smaller than the requests in flight opened a connection per request beyond it,
    # closed it after one use, and logged urllib3's "Connection pool is full" each time: here,
    # one per file (120).
    files = dataset(43, {f"shards/{i:03d}.jsonl": 10_000 + i for i in range(120)})
    fill(bucket, "d", files)
    proxy = proxies(s3_endpoint, keep_alive=True)
    out = tmp_path / "out"
    run = launch("dataset", env=s3_env(bucket, proxy.url, "d", out, WORKERS=str(WORKERS)))
    assert run.finish() == 0, run.stderr
    assert_identical(out, files)
    assert proxy.requests > len(files)
    # One per request in flight, plus the listing's (before a fork); the native client may open
    # one more now and then, when a request starts before the connection of the response just
    # read is back in its pool (about one run in eight here, before this bound allowed it too).
    in_flight = loop_in_flight(WORKERS, [len(data) for data in files.values()])
    assert proxy.connections <= in_flight + 1 + in_flight // 2
    assert "pool is full" not in run.stderr

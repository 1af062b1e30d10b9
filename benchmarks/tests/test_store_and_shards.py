"""The second-TrainJob and sharding scenarios: the rate proxy's cap on real transfers through
nginx, the scenario names, the order of the sharded runs, and both scenarios run whole."""

from __future__ import annotations

import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from benchmarks import harness, schedule
from benchmarks.contenders import Context, Curl8, Ours
from benchmarks.endpoints import Endpoints
from benchmarks.fixtures import BUCKET, Fixture
from benchmarks.harness import Harness
from benchmarks.rateproxy import BURST, CHUNK, Bucket, RateProxy

MiB = 1 << 20
BIG = "model/model-00002-of-00008.safetensors"  # about 10 MiB at the tests' scale


def _get_all(url: str, streams: int, each: int) -> tuple[float, list[bytes]]:
    """GET ``url`` ``each`` times one after the other on each of ``streams`` threads at once;
    (seconds until the last ended, the bodies)."""
    bodies: list[bytes] = []

    def get() -> None:
        for _ in range(each):
            with urllib.request.urlopen(url, timeout=60) as response:
                bodies.append(response.read())

    threads = [threading.Thread(target=get) for _ in range(streams)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - start, bodies


@pytest.mark.parametrize("connections", [1, 4])
def test_the_proxy_cap_holds_within_10_percent_for_all_its_connections_together(
    fixture: Fixture, endpoints: Endpoints, tmp_path: Path, connections: int
) -> None:
    cap = 16.0  # MiB/s
    with RateProxy(endpoints.s3_url, cap, tmp_path) as proxy:
        # Four GETs of about 10 MiB, one at a time or all at once: the cap is the proxy's.
        url = f"{proxy.url}/{BUCKET}/{BIG}"
        elapsed, bodies = _get_all(url, streams=connections, each=4 // connections)
    expected = fixture.source_path(BIG).read_bytes()
    assert all(body == expected for body in bodies)
    rate = len(expected) * len(bodies) / MiB / elapsed
    assert 0.9 * cap <= rate <= 1.1 * cap, f"{rate:.1f} MiB/s through a {cap:g} MiB/s proxy"


def test_without_a_cap_the_proxy_relays_far_faster_than_the_cap(
    fixture: Fixture, endpoints: Endpoints, tmp_path: Path
) -> None:
    with RateProxy(endpoints.s3_url, None, tmp_path) as proxy:
        before = proxy.cpu_s()
        elapsed, bodies = _get_all(f"{proxy.url}/{BUCKET}/{BIG}", streams=4, each=1)
        assert proxy.cpu_s() > before  # its CPU is measured apart from the client's
    assert all(body == fixture.source_path(BIG).read_bytes() for body in bodies)
    assert sum(map(len, bodies)) / MiB / elapsed > 3 * 16.0


def test_the_bucket_never_lets_more_than_the_rate_plus_one_burst_through() -> None:
    rate = 10 * MiB
    bucket = Bucket(rate, now=0.0)
    sent: list[tuple[float, int]] = []  # when each chunk may go, and its size
    now = 0.0
    for i in range(400):  # eight connections taking turns, each chunk as soon as it may
        n = CHUNK if i % 3 else CHUNK // 7
        sent.append((now + bucket.delay(n, now), n))
        now += 0.001 * (i % 8 == 0)
    sent.sort()
    total = 0
    for due, n in sent:
        total += n
        assert total <= rate * due + BURST + CHUNK
    assert total / sent[-1][0] == pytest.approx(rate, rel=0.05)


def test_the_new_scenarios_are_named_like_the_others_and_run_by_default() -> None:
    for name in ("second-trainjob-s3-model", "second-trainjob-hf-model", "shards-s3-dataset"):
        assert name in harness.DEFAULT_SCENARIOS
    assert harness.parse_scenarios("second-trainjob") == [
        "second-trainjob-s3-model",
        "second-trainjob-hf-model",
    ]
    assert harness.parse_scenarios("shards") == ["shards-s3-dataset"]
    assert harness.parse_scenarios("shards-s3-model,second-trainjob-hf-dataset,cold-s3-model") == [
        "shards-s3-model",
        "second-trainjob-hf-dataset",
        "cold-s3-model",
    ]
    assert harness.parts("second-trainjob-hf-model") == ("second-trainjob", "hf", "model")
    assert harness.parts("cold-s3-dataset") == ("cold", "s3", "dataset")
    for bad in ("shards-hf-dataset", "second-trainjob-gcs-model", "second-s3-model", "shard-s3"):
        with pytest.raises(ValueError):
            harness.parse_scenarios(bad)


def test_the_shard_counts_run_forwards_then_backwards() -> None:
    slots = schedule.alternating(["k1", "k2", "k4"], rounds=3)
    assert [(s.round, s.contender) for s in slots] == [
        (0, "k1"), (0, "k2"), (0, "k4"),
        (1, "k4"), (1, "k2"), (1, "k1"),
        (2, "k1"), (2, "k2"), (2, "k4"),
    ]  # fmt: skip


@pytest.fixture
def ctx(fixture: Fixture, endpoints: Endpoints, tmp_path: Path) -> Context:
    venv = Path(sys.prefix)  # the bench venv these tests run in
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    return Context(fixture, endpoints.s3_url, endpoints.hub_url, venv, venv, scratch)


def test_a_second_trainjob_links_a_new_workspace_to_the_store_and_fetches_no_file_data(
    ctx: Context, fixture: Fixture, endpoints: Endpoints, tmp_path: Path
) -> None:
    runner = Harness(ctx, endpoints, tmp_path / "out", log=lambda _: None)
    runner.run_scenario("second-trainjob-s3-model", [Ours(), Curl8()], rounds=2)
    assert [(r.run, r.contender) for r in runner.records] == [
        (0, "ours"), (0, "curl-8"), (1, "curl-8"), (1, "ours"),
    ]  # fmt: skip
    assert all(r.ok for r in runner.records), [(r.problems, r.log_tail) for r in runner.records]
    for r in runner.records:
        if r.contender == "ours":
            assert r.data_bytes == 0  # the listing and the HEAD only
            assert 0 < r.served_bytes < 64 * 1024 and r.requests >= 2
        else:
            assert r.data_bytes == fixture.expected_bytes("model")
    assert not (ctx.scratch / "asset-store").exists()  # removed after the scenario


def test_the_sharded_runs_fill_one_tree_with_one_manifest_behind_their_proxies(
    ctx: Context, fixture: Fixture, endpoints: Endpoints, tmp_path: Path
) -> None:
    runner = Harness(ctx, endpoints, tmp_path / "out", log=lambda _: None, shard_cap_mib_s=64)
    runner.run_scenario("shards-s3-dataset", [Ours(), Curl8()], rounds=1)
    got = {r.contender: r for r in runner.records}
    assert list(got) == ["ours-k1", "ours-k2", "ours-k4", "ours-k4-uncapped"]
    assert all(r.ok for r in runner.records), [(r.problems, r.log_tail) for r in runner.records]
    for r in runner.records:
        assert r.data_bytes == fixture.expected_bytes("dataset")  # every file fetched once
        assert r.proxy_cpu_s is not None and r.proxy_cpu_s > 0
        assert r.path_cpu_s is not None and r.path_cpu_s > r.cpu_s
    assert [got[n].shards for n in got] == [1, 2, 4, 4]
    assert [got[n].cap_mib_s for n in got] == [64, 64, 64, None]
    logs = tmp_path / "out" / "logs" / "shards-s3-dataset-002-r0-ours-k4"
    assert sorted(p.name for p in logs.iterdir()) == [f"shard-{i}.log" for i in range(4)]


def _results() -> dict:
    from benchmarks.tests.test_report import _results as cold_results

    results = cold_results()
    records = results["records"]
    base = dict(records[0], first_get_s=None)
    for rnd in range(3):
        ours_first = rnd % 2 == 0
        pair = [
            dict(base, scenario="second-trainjob-s3-model", contender="ours", run=rnd,
                 wall_s=0.5 + 0.1 * rnd, data_bytes=0, served_bytes=7000, requests=2,
                 pair="s5cmd"),
            dict(base, scenario="second-trainjob-s3-model", contender="s5cmd", run=rnd,
                 wall_s=3.0, data_bytes=2048 * MiB, served_bytes=2048 * MiB + 9000,
                 requests=17, pair="s5cmd"),
        ]  # fmt: skip
        records += pair if ours_first else pair[::-1]
        # 100 MiB: K=1 in 5 s (20 MiB/s); K=2 in 2.5/2.6/2.8 s; K=4 in 1.4 s; uncapped in 0.5 s.
        for name, k, cap, wall in (
            ("ours-k1", 1, 20.0, 5.0), ("ours-k2", 2, 20.0, (2.5, 2.6, 2.8)[rnd]),
            ("ours-k4", 4, 20.0, 1.4), ("ours-k4-uncapped", 4, None, 0.5),
        ):  # fmt: skip
            records.append(
                dict(base, scenario="shards-s3-dataset", contender=name, run=rnd, wall_s=wall,
                     pair=None, shards=k, cap_mib_s=cap, proxy_cpu_s=0.1 * wall,
                     path_cpu_s=0.8 * wall)
            )  # fmt: skip
    results["meta"]["shard_cap_mib_s"] = 20.0
    return results


def test_the_report_has_the_second_trainjob_and_sharding_tables_and_targets() -> None:
    from benchmarks import report

    X, D = report.TIMES, report.DASH
    text = report.markdown(_results())
    assert (
        "| second TrainJob, warm cache (S3 model): ≤ 1 s, 0 bytes | 0.60 s (median), 0 B of file "
        "data (most of any run) | yes |"
    ) in text
    assert "### Second TrainJob: the same model into a new workspace, S3 (16 files" in text
    assert (
        "| **kf-initializers (this project), warm asset store** | 0.60 | 0 B | 6.8 KiB | 2 |  |"
    ) in text
    peer = f"| s5cmd, fresh fetch | 3.00 | 2,048.0 MiB | 2,048.0 MiB | 17 | 5.00{X} (4.29{D}6.00"
    assert peer in text
    # K=2: 5 / (2 x 2.5, 2.6, 2.8) -> 1.00, 0.96, 0.89; K=4: 5 / (4 x 1.4) = 0.89 every round.
    assert (
        f"| sharding: aggregate ≥ 0.8 {X} K {X} one capped shard, K=2 | 0.96{X} (0.89{D}1.00, "
        "3 rounds) | yes |"
    ) in text
    k4 = f"| sharding: aggregate ≥ 0.8 {X} K {X} one capped shard, K=4 | 0.89{X} (0.89{D}0.89"
    assert k4 in text
    assert "each shard behind its own 20 MiB/s proxy (2002 files, 100 MiB)" in text
    one = f"| 1 | 20 MiB/s | 5.00 | 20.0 (20.0{D}20.0) | 20.0 | {D} | 10 (10{D}10) | 40 (40"
    assert one in text
    assert f"| 4 | {D} (no cap, reference) | 0.50 | 200.0 (200.0{D}200.0) | 50.0 | {D} |" in text
    assert f"reach 200 MiB/s (median), 2.5{X} the 4 caps together (80 MiB/s), so at" in text

"""Whole runs through the harness and the naive obstore script, against the real endpoints."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from benchmarks import accesslog, measure, ratios, verify
from benchmarks.contenders import Context, Curl8, DiskCopy, HfObstore, Task, environment
from benchmarks.endpoints import Endpoints
from benchmarks.fixtures import Fixture
from benchmarks.harness import Harness


class FakeOurs(Curl8):
    """Stands in for ours (the name the pairing anchors on) without the engine's start-up."""

    name, reference = "ours", False


@pytest.fixture
def ctx(fixture: Fixture, endpoints: Endpoints, tmp_path: Path) -> Context:
    venv = Path(sys.prefix)  # the bench venv these tests run in
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    return Context(fixture, endpoints.s3_url, endpoints.hub_url, venv, venv, scratch)


def test_a_cold_scenario_runs_ours_and_the_peer_back_to_back_in_alternating_order(
    ctx: Context, endpoints: Endpoints, tmp_path: Path
) -> None:
    lines: list[str] = []
    runner = Harness(ctx, endpoints, tmp_path / "out", log=lines.append)
    destinations: list[Path] = []
    invoke = runner._invoke
    runner._invoke = lambda c, task, dest, tag, **kw: (  # type: ignore[method-assign]
        destinations.append(dest) or invoke(c, task, dest, tag, **kw)
    )
    runner.run_scenario("cold-s3-dataset", [FakeOurs(), Curl8()], rounds=2)
    # Every run had a fresh folder of its own under runs/, removed once the run was checked.
    assert len(set(destinations)) == len(destinations) == 5
    assert all(d.parent == tmp_path / "out" / "runs" for d in destinations)
    assert not any((tmp_path / "out" / "runs").iterdir())
    # First a run of ours that is not measured, so the first round follows a fetch too.
    assert "warm-up run, not measured" in lines[1] and "ours" in lines[1]
    assert (tmp_path / "out" / "logs" / "cold-s3-dataset-warm-up-ours.log").exists()
    order = [(r.run, r.contender, r.pair) for r in runner.records]
    assert order == [
        (0, "ours", "curl-8"), (0, "curl-8", "curl-8"),
        (1, "curl-8", "curl-8"), (1, "ours", "curl-8"),
    ]  # fmt: skip
    assert all(r.ok for r in runner.records), [r.problems for r in runner.records]
    for r in runner.records:
        assert r.first_get_s is not None and 0 < r.first_get_s < r.wall_s
    figure = ratios.paired_ratio([vars(r) for r in runner.records], "curl-8")
    assert figure is not None and figure.rounds == 2


def test_a_latency_scenario_goes_to_the_delayed_ports_and_leaves_out_the_disk_copy(
    ctx: Context, fixture: Fixture, endpoints: Endpoints, tmp_path: Path
) -> None:
    runner = Harness(ctx, endpoints, tmp_path / "out", log=lambda _: None)
    position = endpoints.log_position()
    runner.run_scenario("latency-s3-dataset", [FakeOurs(), Curl8(), DiskCopy()], rounds=1)
    assert {r.contender for r in runner.records} == {"ours", "curl-8"}
    assert all(r.ok for r in runner.records)
    entries = accesslog.read_since(endpoints.access_log, position)
    assert entries and all(endpoints.ports[e.port].delayed for e in entries)
    # 8 curls, one request in flight each, every response held 20 ms.
    files = len(fixture.expected("dataset"))
    assert all(r.wall_s >= files / 8 * endpoints.latency_s for r in runner.records)


@pytest.mark.parametrize(("asset", "delayed"), [("model", False), ("dataset", True)])
def test_the_naive_hfapi_and_obstore_script_fetches_exactly_the_selected_files(
    ctx: Context, fixture: Fixture, endpoints: Endpoints, tmp_path: Path, asset: str, delayed: bool
) -> None:
    if delayed:
        ctx.s3_url, ctx.hub_url = endpoints.urls(delayed=True)
    task = Task("hf", asset, delayed=delayed)
    dest = tmp_path / "dest"
    inv = HfObstore().command(ctx, task, dest)
    position = endpoints.log_position()
    m = measure.run(inv.argv, environment(ctx, inv), tmp_path / "log")
    assert m.returncode == 0, m.log_tail
    assert verify.check(dest, fixture, asset) == []  # the model's skipped files stay skipped
    traffic = endpoints.traffic_since(position)["hub"]
    assert traffic.data_bytes == fixture.expected_bytes(asset)

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


def test_the_durable_scenario_pairs_ours_durable_with_the_disk_floor_and_nothing_else() -> None:
    from benchmarks import contenders, harness

    assert "durable-s3-model" in harness.DEFAULT_SCENARIOS
    task = harness._task("durable-s3-model")
    assert task.durable
    playing = {c.name for c in contenders.by_names(None) if c.applies(task)}
    assert playing == {"ours-durable", "disk-floor"}
    cold = harness._task("cold-s3-model")
    assert not {"ours-durable", "disk-floor"} & {
        c.name for c in contenders.by_names(None) if c.applies(cold)
    }


def test_ours_durable_is_ours_with_the_durable_flag(ctx: Context, tmp_path: Path) -> None:
    from benchmarks.contenders import Ours, OursDurable

    task = Task("s3", "model", durable=True)
    plain = Ours().command(ctx, task, tmp_path / "dest")
    durable = OursDurable().command(ctx, task, tmp_path / "dest")
    assert durable.argv == [*plain.argv, "--durable"] and durable.env == plain.env


def test_the_disk_floor_writes_the_same_files_synced(ctx: Context, tmp_path: Path) -> None:
    from benchmarks.contenders import DiskFloor

    dest = tmp_path / "floor"
    invocation = DiskFloor().command(ctx, Task("s3", "model", durable=True), dest)
    got = measure.run(invocation.argv, environment(ctx, invocation), tmp_path / "floor.log")
    assert got.returncode == 0, got.log_tail
    assert verify.check(dest, ctx.fixture, "model") == []
    assert "conv=fdatasync" in invocation.argv[-1]


def test_a_write_size_variant_is_the_measured_code_with_that_constant_changed(
    ctx: Context, tmp_path: Path
) -> None:
    import shutil

    from benchmarks import contenders

    measured = tmp_path / "src"
    shutil.copytree(Path(contenders.REPO_ROOT) / "initializers", measured / "initializers")
    variant = contenders.OursWriteSize(256)
    assert variant.optional and variant.name not in {c.name for c in contenders.by_names(None)}
    invocation = variant.command(
        Context(**{**vars(ctx), "ours_src": measured}), Task("s3", "model"), tmp_path / "d"
    )
    copy = Path(invocation.env["PYTHONPATH"])
    assert copy == tmp_path / "src-w256k"
    fsutil = (copy / "initializers" / "fsutil.py").read_text()
    assert "\nWRITE_SIZE = 262144\n" in fsutil
    assert "\nWRITE_SIZE = 262144\n" not in (measured / "initializers" / "fsutil.py").read_text()


def test_every_s3_client_fetches_the_dataset_over_https_trusting_the_sessions_ca(
    ctx: Context, fixture: Fixture, endpoints: Endpoints, tmp_path: Path
) -> None:
    from benchmarks import contenders, harness

    kserve = contenders.REPO_ROOT / ".bench" / "kserve"  # made by benchmarks/setup.sh
    ctx.kserve_venv = kserve
    task = harness._task("cold-s3tls-dataset")
    playing = [
        c for c in contenders.by_names(None)
        if c.applies(task) and not isinstance(c, DiskCopy)  # a local copy: no client
        and (c.name != "kserve" or kserve.exists())
    ]  # fmt: skip
    assert {"ours", "s5cmd", "aws-cli", "boto3", "curl-8"} <= {c.name for c in playing}
    runner = Harness(ctx, endpoints, tmp_path / "out", log=lambda _: None)
    for contender in playing:
        dest = tmp_path / contender.name
        position = endpoints.log_position()
        m, _ = runner._invoke(contender, task, dest, contender.name)
        assert m.returncode == 0, (contender.name, m.log_tail)
        assert verify.check(dest, fixture, "dataset") == [], contender.name
        entries = accesslog.read_since(endpoints.access_log, position)
        assert entries and all(endpoints.ports[e.port].tls for e in entries), contender.name

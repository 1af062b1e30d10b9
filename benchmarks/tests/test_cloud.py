"""The gs:// and az:// scenarios: ours and each cloud SDK against the test suite's emulators."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks import harness, ratios, report
from benchmarks.cloudemulators import CloudEmulators, azurite_missing
from benchmarks.contenders import AzureBlobSdk, Context, GcsTransferManager, Ours
from benchmarks.endpoints import Endpoints
from benchmarks.fixtures import Fixture
from benchmarks.tests.test_report import MACHINE, _rec

MiB = 1 << 20


def test_the_emulator_scenarios_are_cold_only_and_run_by_default() -> None:
    assert {"cold-gcs-model", "cold-az-model"} <= set(harness.DEFAULT_SCENARIOS)
    assert harness.parse_scenarios("cold-gcs-model,cold-az-model") == [
        "cold-gcs-model",
        "cold-az-model",
    ]
    assert "cold-gcs-model" in harness.parse_scenarios("cold")
    with pytest.raises(ValueError, match="only the cold scenario"):
        harness.parse_scenarios("warm-gcs-model")


@pytest.fixture(scope="module")
def clouds(fixture: Fixture, tmp_path_factory: pytest.TempPathFactory) -> Iterator[CloudEmulators]:
    assets = {"gcs": {"model"}, "az": {"model"}}
    with CloudEmulators(
        fixture, tmp_path_factory.mktemp("emulators"), assets, log=lambda _: None
    ) as c:
        yield c


@pytest.mark.parametrize(
    ("source", "peer"), [("gcs", GcsTransferManager()), ("az", AzureBlobSdk())], ids=["gcs", "az"]
)
def test_ours_and_the_sdk_fetch_the_model_from_the_emulator_in_pairs(
    clouds: CloudEmulators, fixture: Fixture, endpoints: Endpoints, tmp_path: Path, source, peer
) -> None:  # type: ignore[no-untyped-def]
    if source == "az" and azurite_missing():
        pytest.skip("Azurite is not installed (make azurite)")
    venv = Path(sys.prefix)  # the bench venv these tests run in
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    ctx = Context(fixture, endpoints.s3_url, endpoints.hub_url, venv, venv, scratch)
    address = clouds.serve(source)
    assert clouds.serve(source) == address  # seeded once
    if source == "gcs":
        ctx.gcs_url = address
    else:
        ctx.az_connection_string = address
    runner = harness.Harness(ctx, endpoints, tmp_path / "out", log=lambda _: None)
    scenario = f"cold-{source}-model"
    runner.run_scenario(scenario, [Ours(), peer], rounds=1)
    assert [r.contender for r in runner.records] == ["ours", peer.name]
    # The model's skipped files are in the bucket; the check says nobody fetched them.
    assert all(r.ok for r in runner.records), [(r.problems, r.log_tail) for r in runner.records]
    assert all(r.first_get_s is None and r.data_bytes == 0 for r in runner.records)
    assert ratios.paired_ratio([vars(r) for r in runner.records], peer.name) is not None


def test_the_report_has_a_table_and_a_target_row_per_emulator() -> None:
    records = []
    for rnd, (ours, peer) in enumerate([(2.0, 4.0), (2.0, 3.0), (2.0, 5.0)]):
        for scenario, name in (("cold-gcs-model", "gcs-tm"), ("cold-az-model", "azure-blob")):
            records += [
                _rec(scenario, "ours", rnd, ours, name, first_get_s=None, data_bytes=0),
                _rec(scenario, name, rnd, peer, name, first_get_s=None, data_bytes=0),
            ]
    assets = {"model": {"bytes": 2048 * MiB, "files": 16}, "dataset": {"bytes": 1, "files": 1}}
    meta = {
        "command": "python -m benchmarks", "date": "2026-12-01", "scale": 1.0, "rounds": 3,
        "assets": assets, "machine": MACHINE,
    }  # fmt: skip
    text = report.markdown({"meta": meta, "records": records})
    x, d = report.TIMES, report.DASH
    assert "### Cold fetch, GCS (fake-gcs-server), model (16 files, 2,048 MiB)" in text
    assert "### Cold fetch, Azure Blob (Azurite), model (16 files, 2,048 MiB)" in text
    assert (
        f"| GCS model vs google-cloud-storage transfer manager ≥ 1{x} "
        f"| 2.00{x} (1.50{d}2.50, 3 rounds) | yes |"
    ) in text
    assert f"| Azure model vs azure-storage-blob download_blob ≥ 1{x} | 2.00{x}" in text
    row = f"| google-cloud-storage transfer manager | 4.00 | 512 | 2.00{x} (1.50{d}2.50, 3 rounds) "
    assert row + f"| {d} |" in text  # no nginx in the path: no first data GET

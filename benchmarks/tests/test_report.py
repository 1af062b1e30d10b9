"""The report: paired ratios with their range, first data GETs, the commit, and re-rendering."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from benchmarks import __main__ as cli
from benchmarks import report

MiB = 1 << 20
X, D = report.TIMES, report.DASH
MACHINE = {
    "cpus": 2, "cpu_model": "test CPU", "memory_gib": 23.5, "kernel": "6.1", "os": "Debian",
    "python": "Python 3.11.7", "load_average": [0.5, 0.5, 0.5],
    "versions": {"kf-initializers": "0.1.0", "nginx": "nginx/1.22.1"},
}  # fmt: skip


def _rec(scenario: str, contender: str, rnd: int, wall: float, pair: str | None, **kw) -> dict:
    return {
        "scenario": scenario, "contender": contender, "run": rnd, "wall_s": wall, "cpu_s": 1.0,
        "peak_rss_mib": 50.0, "returncode": 0, "ok": True, "problems": [],
        "data_bytes": 100 * MiB, "requests": 10, "killed_at": None, "log_tail": "",
        "pair": pair, "first_get_s": kw.pop("first_get_s", 0.2), **kw,
    }  # fmt: skip


def _results() -> dict:
    records = []
    # cold-s3-dataset: s5cmd's round ratios 1.5, 1.2, 2.0 -> median 1.5, range 1.2-2.0.
    for rnd, (ours, peer) in enumerate([(2.0, 3.0), (2.5, 3.0), (1.5, 3.0)]):
        records += [
            _rec("cold-s3-dataset", "ours", rnd, ours, "s5cmd", first_get_s=0.3),
            _rec("cold-s3-dataset", "s5cmd", rnd, peer, "s5cmd", first_get_s=0.05),
        ]
    for rnd in range(3):
        records += [
            _rec("latency-s3-dataset", "s5cmd", rnd, 1.0, "s5cmd"),
            _rec("latency-s3-dataset", "ours", rnd, 2.0, "s5cmd"),
        ]
        records.append(_rec("warm-s3-model", "ours", rnd, 0.4, None, data_bytes=0))
    meta = {
        "command": "python -m benchmarks --rounds 3",
        "date": "2026-12-01",
        "commit": {"id": "abc1234", "dirty": True},
        "scale": 1.0,
        "rounds": 3,
        "latency_s": 0.02,
        "assets": {
            "model": {"bytes": 2048 * MiB, "files": 16},
            "dataset": {"bytes": 100 * MiB, "files": 2002},
        },
        "machine": MACHINE,
    }
    return {"meta": meta, "records": records}


def test_a_peer_row_shows_the_median_of_round_ratios_with_range_and_count() -> None:
    text = report.markdown(_results())
    assert f"| s5cmd | 3.00 | 33 | 1.50{X} (1.20{D}2.00, 3 rounds) | 0.05 |" in text
    assert f"| S3 dataset vs s5cmd ≥ 1{X} | 1.50{X} (1.20{D}2.00, 3 rounds) | yes |" in text
    assert (
        f"| Latency S3 dataset vs s5cmd ≥ 1{X} | 0.50{X} (0.50{D}0.50, 3 rounds) | **no** |" in text
    )


def test_the_report_names_the_commit_measured_and_whether_the_tree_was_dirty() -> None:
    results = _results()
    assert "**Commit measured**: `abc1234, dirty (uncommitted changes)`." in report.markdown(
        results
    )
    results["meta"]["commit"]["dirty"] = False
    assert "**Commit measured**: `abc1234`." in report.markdown(results)


def test_ours_first_data_get_is_checked_against_its_goal_per_source() -> None:
    text = report.markdown(_results())
    assert "| **kf-initializers (this project)** | 2.00 | 50 |  | 0.30 |" in text
    assert "| First data GET of ours ≤ 0.25 s after start, S3 | 0.30 s (cold-s3-dataset) | " in text


def test_the_latency_table_names_the_delay() -> None:
    text = report.markdown(_results())
    assert "### Latency: cold fetch, S3, dataset, 20 ms before every response's first byte" in text


def test_results_from_before_the_paired_rounds_still_render_without_ratios() -> None:
    old = copy.deepcopy(_results())
    meta = old["meta"]
    del meta["commit"], meta["latency_s"]
    meta["runs"] = meta.pop("rounds")
    for rec in old["records"]:
        del rec["pair"], rec["first_get_s"]
    text = report.markdown(old)
    assert f"| s5cmd | 3.00 | 33 | {D} | {D} |" in text
    assert "**Commit measured**: not recorded" in text


def test_the_report_option_rerenders_a_saved_run_with_its_chart(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    saved = tmp_path / "results.json"
    saved.write_text(json.dumps(_results()))
    assert cli.main(["--report", str(saved)]) == 0
    assert (tmp_path / "benchmarks.md").read_text() == report.markdown(_results())
    assert (tmp_path / "benchmarks.png").read_bytes().startswith(b"\x89PNG")


def test_the_durable_target_is_ours_durable_against_the_disk_floor_of_the_same_rounds() -> None:
    results = _results()
    # Round ratios floor/durable: 0.95, 0.80, 0.90 -> durable is 1/0.90 = 1.11x the floor.
    for rnd, (durable, floor) in enumerate([(2.0, 1.9), (2.5, 2.0), (2.0, 1.8)]):
        results["records"] += [
            _rec("durable-s3-model", "ours-durable", rnd, durable, "disk-floor"),
            _rec("durable-s3-model", "disk-floor", rnd, floor, "disk-floor"),
        ]
    text = report.markdown(results)
    row = next(line for line in text.splitlines() if "the disk floor" in line)
    assert f"1.11{X} (1.05{D}1.25, 3 rounds)" in row and row.endswith("| **no** |")
    assert "Durable fetch" in text and "ours-durable vs it" in text

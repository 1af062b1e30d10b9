"""Run the scenarios: contenders interleaved (A B C, B C A, ...), each run measured and checked.

Scenarios are ``<kind>-<source>-<asset>``: kind ``cold`` (empty destination), ``warm`` (rerun
into the complete destination the contender itself left), ``resume`` (SIGKILL at about half the
bytes written, then rerun); source ``s3`` or ``hf``; asset ``model`` or ``dataset``.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from benchmarks import measure, verify
from benchmarks.contenders import Contender, Context, Task, environment
from benchmarks.endpoints import Endpoints

MiB = 1 << 20
KINDS = ("cold", "warm", "resume")
DEFAULT_SCENARIOS = (
    "cold-s3-model", "cold-s3-dataset", "cold-hf-model", "cold-hf-dataset",
    "warm-s3-model", "warm-hf-model", "resume-s3-model", "resume-hf-model",
)  # fmt: skip
RESUME_AT = 0.5


@dataclass
class RunRecord:
    """One measured run of one contender in one scenario."""

    scenario: str
    contender: str
    run: int
    wall_s: float
    cpu_s: float
    peak_rss_mib: float
    returncode: int
    ok: bool
    problems: list[str] = field(default_factory=list)
    data_bytes: int = 0  # object bytes the endpoint served in the measured run
    requests: int = 0
    killed_at: float | None = None  # resume: fraction of the asset written when killed
    log_tail: str = ""


def parse_scenarios(raw: str | None) -> list[str]:
    """Expand ``cold,warm-s3-model,...`` (a bare kind means all of that kind's defaults)."""
    if not raw:
        return list(DEFAULT_SCENARIOS)
    out: list[str] = []
    for item in (s.strip() for s in raw.split(",") if s.strip()):
        if item in KINDS:
            out += [s for s in DEFAULT_SCENARIOS if s.startswith(item + "-")]
            continue
        kind, _, rest = item.partition("-")
        source, _, asset = rest.partition("-")
        if kind not in KINDS or source not in ("s3", "hf") or asset not in ("model", "dataset"):
            raise ValueError(
                f"unknown scenario {item!r}; use <cold|warm|resume>-<s3|hf>-<model|dataset>"
            )
        out.append(item)
    return list(dict.fromkeys(out))


def _task(scenario: str, rerun: bool = False) -> Task:
    _kind, source, asset = scenario.split("-")
    return Task(source, asset, rerun)


class Harness:
    """Owns the endpoints, the scratch folders and the records of one benchmark session."""

    def __init__(self, ctx: Context, endpoints: Endpoints, out: Path, log=print) -> None:
        self.ctx = ctx
        self.endpoints = endpoints
        self.out = out
        self.log = log
        self.records: list[RunRecord] = []

    # -- helpers ---------------------------------------------------------------------------
    def _clean(self, dest: Path) -> None:
        if dest.exists():
            shutil.rmtree(dest)
        hf_home = self.ctx.scratch / "hf-home"
        if hf_home.exists():
            shutil.rmtree(hf_home)
        os.sync()  # the previous run's dirty pages are not this run's cost

    def _invoke(
        self, contender: Contender, task: Task, dest: Path, tag: str, kill_after: int | None = None
    ) -> tuple[measure.Measurement, int, int]:
        inv = contender.command(self.ctx, task, dest)
        assert inv is not None
        position = self.endpoints.log_position()
        logfile = self.out / "logs" / f"{tag}.log"
        logfile.parent.mkdir(parents=True, exist_ok=True)
        m = measure.run(
            inv.argv, environment(self.ctx, inv), logfile, kill_after_written=kill_after
        )
        time.sleep(0.05)  # nginx logs a request when it ends; give the last line a moment
        traffic = self.endpoints.traffic_since(position)[("s3" if task.source == "s3" else "hub")]
        return m, traffic.data_bytes, traffic.requests

    def _record(
        self, scenario: str, contender: Contender, run: int, m: measure.Measurement,
        dest: Path, data_bytes: int, requests: int, killed_at: float | None = None,
    ) -> RunRecord:  # fmt: skip
        asset = scenario.split("-")[2]
        problems = [] if m.returncode == 0 else [f"exit code {m.returncode}"]
        problems += verify.check(dest, self.ctx.fixture, asset)
        rec = RunRecord(
            scenario=scenario,
            contender=contender.name,
            run=run,
            wall_s=round(m.wall_s, 4),
            cpu_s=round(m.cpu_s, 3),
            peak_rss_mib=round(m.peak_rss_mib, 1),
            returncode=m.returncode,
            ok=not problems,
            problems=problems,
            data_bytes=data_bytes,
            requests=requests,
            killed_at=killed_at,
            log_tail="" if not problems else m.log_tail[-1500:],
        )
        self.records.append(rec)
        expected = self.ctx.fixture.expected_bytes(asset)
        speed = expected / MiB / m.wall_s if m.wall_s else 0
        status = "ok" if rec.ok else "FAILED: " + "; ".join(problems)[:300]
        extra = f" killed at {killed_at:.0%}" if killed_at is not None else ""
        self.log(
            f"  {scenario:16} {contender.name:12} run {run}: {m.wall_s:7.2f} s "
            f"{speed:7.0f} MiB/s  rss {m.peak_rss_mib:6.0f} MiB  cpu {m.cpu_s:6.1f} s  "
            f"fetched {data_bytes / MiB:7.1f} MiB{extra}  {status}"
        )
        return rec

    # -- scenarios -------------------------------------------------------------------------
    def run_scenario(self, scenario: str, contenders: list[Contender], runs: int) -> None:
        kind = scenario.split("-")[0]
        task = _task(scenario, rerun=kind != "cold")
        playing = [c for c in contenders if c.applies(task)]
        if not playing:
            return
        self.log(f"{scenario}: {', '.join(c.name for c in playing)}, {runs} run(s)")
        warm_ready: set[str] = set()
        for run in range(runs):
            shift = run % len(playing)
            for contender in playing[shift:] + playing[:shift]:
                tag = f"{scenario}-{contender.name}-{run}"
                if kind == "cold":
                    self._cold(scenario, contender, run, tag)
                elif kind == "warm":
                    self._warm(scenario, contender, run, tag, warm_ready)
                else:
                    self._resume(scenario, contender, run, tag)
        if kind == "warm":
            for contender in playing:
                self._clean(self.out / f"warm-{contender.name}")

    def _cold(self, scenario: str, contender: Contender, run: int, tag: str) -> None:
        dest = self.out / "dest"
        self._clean(dest)
        m, data, reqs = self._invoke(contender, _task(scenario), dest, tag)
        self._record(scenario, contender, run, m, dest, data, reqs)
        self._clean(dest)

    def _warm(self, scenario: str, c: Contender, run: int, tag: str, ready: set[str]) -> None:
        dest = self.out / f"warm-{c.name}"
        if c.name not in ready:
            self._clean(dest)
            m, _, _ = self._invoke(c, _task(scenario), dest, tag + "-prep")
            problems = verify.check(dest, self.ctx.fixture, scenario.split("-")[2])
            if m.returncode or problems:
                self.log(
                    f"  {scenario} {c.name}: the first fetch failed, no warm rerun: {problems}"
                )
                return
            ready.add(c.name)
            os.sync()
        m, data, reqs = self._invoke(c, _task(scenario, rerun=True), dest, tag)
        self._record(scenario, c, run, m, dest, data, reqs)

    def _resume(self, scenario: str, contender: Contender, run: int, tag: str) -> None:
        dest = self.out / "dest"
        self._clean(dest)
        total = self.ctx.fixture.expected_bytes(scenario.split("-")[2])
        first, _, _ = self._invoke(
            contender, _task(scenario), dest, tag + "-killed", kill_after=int(total * RESUME_AT)
        )
        killed_at = first.written_at_kill / total if first.killed else 1.0
        os.sync()
        m, data, reqs = self._invoke(contender, _task(scenario, rerun=True), dest, tag)
        self._record(scenario, contender, run, m, dest, data, reqs, killed_at=killed_at)
        self._clean(dest)

    def save(self, path: Path, meta: dict) -> None:
        body = {"meta": meta, "records": [asdict(r) for r in self.records]}
        path.write_text(json.dumps(body, indent=1))

"""Run the scenarios in paired rounds (:mod:`benchmarks.schedule`), each run measured and checked.

Scenarios are ``<kind>-<source>-<asset>``: kind ``cold`` (empty destination), ``latency`` (the
same against the endpoints that wait before every response's first byte, see
:mod:`benchmarks.latency`), ``warm`` (rerun into the complete destination the contender itself
left), ``resume`` (SIGKILL at about half the bytes written, then rerun); source ``s3`` or ``hf``
(nginx), or ``gcs`` or ``az`` (fake-gcs-server and Azurite, :mod:`benchmarks.cloudemulators`,
cold only); asset ``model`` or ``dataset``. ``cold`` and ``latency`` run ours and each peer back
to back, the order alternating; ``warm`` and ``resume`` (absolute figures) interleave the
contenders. Every run also records the delay from its spawn to the arrival of its first data GET
at nginx (not the emulators' runs: no nginx is in their path).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from benchmarks import measure, schedule, verify
from benchmarks.cloudemulators import SOURCES as CLOUD_SOURCES
from benchmarks.contenders import Contender, Context, Task, environment
from benchmarks.endpoints import Endpoints, Traffic

MiB = 1 << 20
KINDS = ("cold", "latency", "warm", "resume")
SOURCES = ("s3", "hf", *CLOUD_SOURCES)
NGINX_ENDPOINT = {"s3": "s3", "hf": "hub"}  # the access log's name of each source nginx serves
PAIRED_KINDS = schedule.PAIRED_KINDS
DEFAULT_SCENARIOS = (
    "cold-s3-model", "cold-s3-dataset", "cold-hf-model", "cold-hf-dataset",
    "cold-gcs-model", "cold-az-model",
    "latency-s3-dataset", "latency-hf-dataset",
    "warm-s3-model", "warm-hf-model", "resume-s3-model", "resume-hf-model",
)  # fmt: skip
RESUME_AT = 0.5


@dataclass
class RunRecord:
    """One measured run of one contender in one scenario."""

    scenario: str
    contender: str
    run: int  # the round
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
    pair: str | None = None  # paired kinds: the peer of the pair this run belongs to
    first_get_s: float | None = None  # spawn to the first data GET's arrival at nginx


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
        if kind not in KINDS or source not in SOURCES or asset not in ("model", "dataset"):
            raise ValueError(
                f"unknown scenario {item!r}; use <{'|'.join(KINDS)}>-<{'|'.join(SOURCES)}>-"
                "<model|dataset>"
            )
        if source in CLOUD_SOURCES and kind != "cold":
            raise ValueError(f"{item!r}: the {source} emulator has only the cold scenario")
        out.append(item)
    return list(dict.fromkeys(out))


def _task(scenario: str, rerun: bool = False) -> Task:
    kind, source, asset = scenario.split("-")
    return Task(source, asset, rerun, delayed=kind == "latency")


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

    def _context(self, task: Task) -> Context:
        """The context of ``task``: the delayed endpoints' URLs for the latency scenarios."""
        if not task.delayed:
            return self.ctx
        s3_url, hub_url = self.endpoints.urls(delayed=True)
        return dataclasses.replace(self.ctx, s3_url=s3_url, hub_url=hub_url)

    def _invoke(
        self, contender: Contender, task: Task, dest: Path, tag: str, kill_after: int | None = None
    ) -> tuple[measure.Measurement, Traffic]:
        ctx = self._context(task)
        inv = contender.command(ctx, task, dest)
        assert inv is not None
        position = self.endpoints.log_position()
        logfile = self.out / "logs" / f"{tag}.log"
        logfile.parent.mkdir(parents=True, exist_ok=True)
        m = measure.run(inv.argv, environment(ctx, inv), logfile, kill_after_written=kill_after)
        time.sleep(0.05)  # nginx logs a request when it ends; give the last line a moment
        endpoint = NGINX_ENDPOINT.get(task.source)
        traffic = self.endpoints.traffic_since(position)[endpoint] if endpoint else Traffic()
        return m, traffic

    def _record(
        self, scenario: str, contender: Contender, slot: schedule.Slot, m: measure.Measurement,
        dest: Path, traffic: Traffic, killed_at: float | None = None,
    ) -> RunRecord:  # fmt: skip
        asset = scenario.split("-")[2]
        problems = [] if m.returncode == 0 else [f"exit code {m.returncode}"]
        problems += verify.check(dest, self.ctx.fixture, asset)
        first_get = (
            None if traffic.first_data_get is None else traffic.first_data_get - m.started_at
        )
        rec = RunRecord(
            scenario=scenario,
            contender=contender.name,
            run=slot.round,
            wall_s=round(m.wall_s, 4),
            cpu_s=round(m.cpu_s, 3),
            peak_rss_mib=round(m.peak_rss_mib, 1),
            returncode=m.returncode,
            ok=not problems,
            problems=problems,
            data_bytes=traffic.data_bytes,
            requests=traffic.requests,
            killed_at=killed_at,
            log_tail="" if not problems else m.log_tail[-1500:],
            pair=slot.pair,
            first_get_s=None if first_get is None else round(first_get, 4),
        )
        self.records.append(rec)
        expected = self.ctx.fixture.expected_bytes(asset)
        speed = expected / MiB / m.wall_s if m.wall_s else 0
        status = "ok" if rec.ok else "FAILED: " + "; ".join(problems)[:300]
        extra = f" killed at {killed_at:.0%}" if killed_at is not None else ""
        ttfb = "   -  " if first_get is None else f"{first_get:6.3f}"
        counted = scenario.split("-")[1] in NGINX_ENDPOINT
        fetched = f"{traffic.data_bytes / MiB:7.1f}" if counted else "      -"
        self.log(
            f"  {scenario:18} {contender.name:13} round {slot.round}: {m.wall_s:7.2f} s "
            f"{speed:7.0f} MiB/s  1st GET {ttfb} s  rss {m.peak_rss_mib:6.0f} MiB  "
            f"cpu {m.cpu_s:6.1f} s  fetched {fetched} MiB{extra}  {status}"
        )
        return rec

    # -- scenarios -------------------------------------------------------------------------
    def run_scenario(self, scenario: str, contenders: list[Contender], rounds: int) -> None:
        kind = scenario.split("-")[0]
        task = _task(scenario, rerun=kind in ("warm", "resume"))
        playing = {c.name: c for c in contenders if c.applies(task)}
        if not playing:
            return
        names = list(playing)
        paired = kind in PAIRED_KINDS
        slots = schedule.paired(names, rounds) if paired else schedule.interleaved(names, rounds)
        how = "paired with ours, order alternating" if paired else "interleaved"
        self.log(f"{scenario}: {', '.join(names)}; {rounds} round(s), {how}")
        warm_ready: set[str] = set()
        for i, slot in enumerate(slots):
            contender = playing[slot.contender]
            tag = f"{scenario}-{i:03d}-r{slot.round}-{contender.name}"
            if kind in PAIRED_KINDS:
                self._cold(scenario, contender, slot, tag)
            elif kind == "warm":
                self._warm(scenario, contender, slot, tag, warm_ready)
            else:
                self._resume(scenario, contender, slot, tag)
        if kind == "warm":
            for name in names:
                self._clean(self.out / f"warm-{name}")

    def _cold(self, scenario: str, contender: Contender, slot: schedule.Slot, tag: str) -> None:
        dest = self.out / "dest"
        self._clean(dest)
        m, traffic = self._invoke(contender, _task(scenario), dest, tag)
        self._record(scenario, contender, slot, m, dest, traffic)
        self._clean(dest)

    def _warm(
        self, scenario: str, c: Contender, slot: schedule.Slot, tag: str, ready: set[str]
    ) -> None:
        dest = self.out / f"warm-{c.name}"
        if c.name not in ready:
            self._clean(dest)
            m, _ = self._invoke(c, _task(scenario), dest, tag + "-prep")
            problems = verify.check(dest, self.ctx.fixture, scenario.split("-")[2])
            if m.returncode or problems:
                self.log(
                    f"  {scenario} {c.name}: the first fetch failed, no warm rerun: {problems}"
                )
                return
            ready.add(c.name)
            os.sync()
        m, traffic = self._invoke(c, _task(scenario, rerun=True), dest, tag)
        self._record(scenario, c, slot, m, dest, traffic)

    def _resume(self, scenario: str, contender: Contender, slot: schedule.Slot, tag: str) -> None:
        dest = self.out / "dest"
        self._clean(dest)
        total = self.ctx.fixture.expected_bytes(scenario.split("-")[2])
        first, _ = self._invoke(
            contender, _task(scenario), dest, tag + "-killed", kill_after=int(total * RESUME_AT)
        )
        killed_at = first.written_at_kill / total if first.killed else 1.0
        os.sync()
        m, traffic = self._invoke(contender, _task(scenario, rerun=True), dest, tag)
        self._record(scenario, contender, slot, m, dest, traffic, killed_at=killed_at)
        self._clean(dest)

    def save(self, path: Path, meta: dict) -> None:
        body = {"meta": meta, "records": [asdict(r) for r in self.records]}
        path.write_text(json.dumps(body, indent=1))

"""Run the scenarios in paired rounds (:mod:`benchmarks.schedule`), each run measured and checked.

Scenarios are ``<kind>-<source>-<asset>``: kind ``cold`` (empty destination), ``latency`` (the
same against the endpoints that wait before every response's first byte, see
:mod:`benchmarks.latency`), ``warm`` (rerun into the complete destination the contender itself
left), ``resume`` (SIGKILL at about half the bytes written, then rerun), ``second-trainjob``
(ours links a new workspace to the asset store an earlier run filled, each peer fetches afresh),
``shards`` (ours as K = 1, 2, 4 processes, each behind its own rate-capped proxy, see
:mod:`benchmarks.rateproxy`), ``durable`` (ours with ``--durable`` against the disk's floor, ``dd
conv=fdatasync`` of the same files); source ``s3`` or ``hf`` (nginx; ``s3nginx``: the same
bucket with nginx's own ETags and no checksums, ``s3tls``: the bucket over HTTPS, both cold
only), or ``gcs`` or ``az``
(fake-gcs-server and Azurite, :mod:`benchmarks.cloudemulators`, cold only); asset ``model`` or
``dataset``. ``cold``, ``latency``, ``durable`` and ``second-trainjob`` run ours and each peer
back to back, the order alternating; ``warm`` and ``resume`` (absolute figures) interleave the
contenders; ``shards`` runs its variants forwards and backwards in turn. Every run also records
the delay from its spawn to the arrival of its first data GET at nginx (not the emulators' runs:
no nginx is in their path).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

from benchmarks import measure, schedule, verify
from benchmarks.cloudemulators import SOURCES as CLOUD_SOURCES
from benchmarks.contenders import Contender, Context, Invocation, Ours, Task, environment
from benchmarks.endpoints import Endpoints, Traffic
from benchmarks.rateproxy import RateProxy

MiB = 1 << 20
SECOND_TRAINJOB, SHARDS = "second-trainjob", "shards"
KINDS = ("cold", "latency", "durable", "warm", "resume", SECOND_TRAINJOB, SHARDS)
NGINX_ETAGS = "s3nginx"  # S3 with nginx's own ETags and no checksums: what a plain server sends
TLS = "s3tls"  # S3 over HTTPS, as every real endpoint is
S3_PORTS = (NGINX_ETAGS, TLS)  # the sources that are S3 on another port, with the cold kind only
SOURCES = ("s3", *S3_PORTS, "hf", *CLOUD_SOURCES)
# The access log's name of each source nginx serves.
NGINX_ENDPOINT = {"s3": "s3", NGINX_ETAGS: "s3", TLS: "s3", "hf": "hub"}
PAIRED_KINDS = schedule.PAIRED_KINDS
DEFAULT_SCENARIOS = (
    "cold-s3-model", "cold-s3-dataset", "cold-hf-model", "cold-hf-dataset",
    "cold-gcs-model", "cold-az-model",
    "latency-s3-dataset", "latency-hf-dataset",
    "warm-s3-model", "warm-hf-model", "resume-s3-model", "resume-hf-model",
    "second-trainjob-s3-model", "second-trainjob-hf-model", "shards-s3-dataset",
    "cold-s3nginx-model", "cold-s3nginx-dataset", "cold-s3tls-model", "cold-s3tls-dataset",
    "cold-s3-files", "durable-s3-model",
)  # fmt: skip
# "files": 100,000 small objects, in cold-s3-files only (ours and s5cmd): a round takes ~1
# minute. A million: `make bench-manyfiles` (benchmarks/manyfiles.py).
ASSETS = ("model", "dataset", schedule.MANY_FILES)
RESUME_AT = 0.5
# The sharding scenario: how many shards, and each one's cap (one node's NIC, see the README).
SHARD_COUNTS = (1, 2, 4)
SHARD_CAP_MIB_S = 20.0
UNCAPPED = "uncapped"  # the variant with K = max(SHARD_COUNTS) through proxies without a cap


parts = schedule.parts


def shard_variant(count: int, capped: bool = True) -> str:
    """The contender name of one sharding variant: ``ours-k4``, ``ours-k4-uncapped``."""
    return f"ours-k{count}" + ("" if capped else f"-{UNCAPPED}")


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
    served_bytes: int = 0  # every body the endpoint sent in the run: listings, API answers too
    shards: int | None = None  # the sharding scenario: K processes of ours
    cap_mib_s: float | None = None  # ... each behind a proxy capped at this (None: uncapped)
    proxy_cpu_s: float | None = None  # ... the proxies' CPU over the run, all of them
    path_cpu_s: float | None = None  # ... ours, the proxies, nginx and the S3 API layer together


def parse_scenarios(raw: str | None) -> list[str]:
    """Expand ``cold,warm-s3-model,...`` (a bare kind means all of that kind's defaults)."""
    if not raw:
        return list(DEFAULT_SCENARIOS)
    out: list[str] = []
    for item in (s.strip() for s in raw.split(",") if s.strip()):
        if item in KINDS:
            out += [s for s in DEFAULT_SCENARIOS if parts(s)[0] == item]
            continue
        try:
            kind, source, asset = parts(item)
        except ValueError:
            kind = source = asset = ""
        if kind not in KINDS or source not in SOURCES or asset not in ASSETS:
            raise ValueError(
                f"unknown scenario {item!r}; use <{'|'.join(KINDS)}>-<{'|'.join(SOURCES)}>-"
                f"<{'|'.join(ASSETS)}>"
            )
        if asset == schedule.MANY_FILES and item != schedule.MANY_FILES_SCENARIO:
            raise ValueError(
                f"{item!r}: the many-files asset has one scenario, {schedule.MANY_FILES_SCENARIO}"
            )
        if source in CLOUD_SOURCES and kind != "cold":
            raise ValueError(f"{item!r}: the {source} emulator has only the cold scenario")
        if kind == SHARDS and source != "s3":
            raise ValueError(f"{item!r}: the sharding scenario runs on S3 (its proxies relay S3)")
        if source in S3_PORTS and kind != "cold":
            raise ValueError(f"{item!r}: the {source} port has only the cold scenario")
        if kind == "durable" and item != "durable-s3-model":
            raise ValueError(f"{item!r}: the durable scenario is durable-s3-model")
        out.append(item)
    return list(dict.fromkeys(out))


def _task(scenario: str, rerun: bool = False) -> Task:
    kind, source, asset = parts(scenario)
    return Task(
        "s3" if source in S3_PORTS else source, asset, rerun,
        delayed=kind == "latency", durable=kind == "durable",
        nginx_etags=source == NGINX_ETAGS, tls=source == TLS,
    )  # fmt: skip


def _remove(path: Path) -> None:
    """Delete a destination: a link (ours' output with an asset store) or a folder."""
    if path.is_symlink():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)


def _cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds used so far by the processes ``pids`` (not their children)."""
    total = 0.0
    for pid in pids:
        try:
            times = psutil.Process(pid).cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


class Harness:
    """Owns the endpoints, the scratch folders and the records of one benchmark session."""

    def __init__(
        self, ctx: Context, endpoints: Endpoints, out: Path, log=print,
        shard_cap_mib_s: float = SHARD_CAP_MIB_S, idle_s: float = 0.0,
    ) -> None:  # fmt: skip
        self.ctx = ctx
        self.endpoints = endpoints
        self.out = out
        self.runs = out / "runs"  # each run's destination: a fresh folder (destinations.py)
        self.log = log
        self.shard_cap_mib_s = shard_cap_mib_s
        self.idle_s = idle_s  # a pause before each paired run: the machine idle, not back to back
        self.records: list[RunRecord] = []

    # -- helpers ---------------------------------------------------------------------------
    def _clean(self, dest: Path) -> None:
        _remove(dest)
        hf_home = self.ctx.scratch / "hf-home"
        if hf_home.exists():
            shutil.rmtree(hf_home)
        os.sync()  # the previous run's dirty pages are not this run's cost

    def _context(self, task: Task) -> Context:
        """The context of ``task``: the delayed endpoints' URLs for the latency scenarios, the
        nginx-style S3 port for the s3nginx ones, the HTTPS port and its CA for the s3tls ones."""
        if task.nginx_etags:
            return dataclasses.replace(self.ctx, s3_url=self.endpoints.nginx_s3_url)
        if task.tls:
            return dataclasses.replace(
                self.ctx, s3_url=self.endpoints.tls_s3_url, ca_bundle=str(self.endpoints.ca_bundle)
            )
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
        return self._measure(inv, ctx, task, tag, kill_after)

    def _measure(
        self, inv: Invocation, ctx: Context, task: Task, tag: str, kill_after: int | None = None
    ) -> tuple[measure.Measurement, Traffic]:
        position = self.endpoints.log_position()
        logfile = self.out / "logs" / f"{tag}.log"
        logfile.parent.mkdir(parents=True, exist_ok=True)
        m = measure.run(inv.argv, environment(ctx, inv), logfile, kill_after_written=kill_after)
        time.sleep(0.05)  # nginx logs a request when it ends; give the last line a moment
        endpoint = NGINX_ENDPOINT.get(task.source)
        traffic = self.endpoints.traffic_since(position)[endpoint] if endpoint else Traffic()
        return m, traffic

    def _record(
        self, scenario: str, contender: Contender | str, slot: schedule.Slot,
        m: measure.Measurement, dest: Path, traffic: Traffic, killed_at: float | None = None,
        problems: list[str] | None = None, **extra: object,
    ) -> RunRecord:  # fmt: skip
        """Check ``dest``, keep the run's record (``problems``: found by the caller; ``extra``:
        more fields of :class:`RunRecord`) and log one line."""
        _kind, source, asset = parts(scenario)
        name = contender if isinstance(contender, str) else contender.name
        found = list(problems or [])
        problems = ([f"exit code {m.returncode}"] if m.returncode else []) + found
        problems += verify.check(dest, self.ctx.fixture, asset)
        first_get = (
            None if traffic.first_data_get is None else traffic.first_data_get - m.started_at
        )
        rec = RunRecord(
            scenario=scenario,
            contender=name,
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
            served_bytes=traffic.bytes,
            **extra,  # type: ignore[arg-type]
        )
        self.records.append(rec)
        expected = self.ctx.fixture.expected_bytes(asset)
        speed = expected / MiB / m.wall_s if m.wall_s else 0
        status = "ok" if rec.ok else "FAILED: " + "; ".join(problems)[:300]
        extra = f" killed at {killed_at:.0%}" if killed_at is not None else ""
        ttfb = "   -  " if first_get is None else f"{first_get:6.3f}"
        counted = source in NGINX_ENDPOINT
        fetched = f"{traffic.data_bytes / MiB:7.1f}" if counted else "      -"
        self.log(
            f"  {scenario:18} {name:13} round {slot.round}: {m.wall_s:7.2f} s "
            f"{speed:7.0f} MiB/s  1st GET {ttfb} s  rss {m.peak_rss_mib:6.0f} MiB  "
            f"cpu {m.cpu_s:6.1f} s  fetched {fetched} MiB{extra}  {status}"
        )
        return rec

    # -- scenarios -------------------------------------------------------------------------
    def run_scenario(self, scenario: str, contenders: list[Contender], rounds: int) -> None:
        kind = parts(scenario)[0]
        if kind == SECOND_TRAINJOB:
            self._second_trainjob(scenario, contenders, rounds)
            return
        if kind == SHARDS:
            self._shards(scenario, contenders, rounds)
            return
        task = _task(scenario, rerun=kind in ("warm", "resume"))
        playing = {c.name: c for c in contenders if c.applies(task)}
        if not playing:
            return
        names = list(playing)
        paired = kind in PAIRED_KINDS
        anchor = schedule.anchor_of(kind)
        slots = (
            schedule.paired(names, rounds, anchor)
            if paired
            else schedule.interleaved(names, rounds)
        )
        how = f"paired with {anchor}, order alternating" if paired else "interleaved"
        self.log(f"{scenario}: {', '.join(names)}; {rounds} round(s), {how}")
        warm_ready: set[str] = set()
        if paired:
            self._warm_up(scenario, playing.get(anchor) or playing[names[0]])
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

    def _warm_up(self, scenario: str, contender: Contender) -> None:
        """One run before a paired scenario's rounds, not measured, so that the first run follows
        a fetch of the same asset as every later run does: on this VM the scenario's first run
        was the slow one (ours, S3 model: 5.90 s at 8.8 CPU-seconds, 1.55-2.27 s in its other
        runs), handed memory the host had taken back before the scenario."""
        tag = f"{scenario}-warm-up-{contender.name}"
        dest = self.runs / tag
        self._clean(dest)
        self.log(f"  {scenario:18} {contender.name:13} warm-up run, not measured")
        self._invoke(contender, _task(scenario), dest, tag)
        self._clean(dest)

    def _cold(self, scenario: str, contender: Contender, slot: schedule.Slot, tag: str) -> None:
        dest = self.runs / tag
        self._clean(dest)
        if self.idle_s:
            time.sleep(self.idle_s)
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
            problems = verify.check(dest, self.ctx.fixture, parts(scenario)[2])
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
        dest = self.runs / tag
        self._clean(dest)
        total = self.ctx.fixture.expected_bytes(parts(scenario)[2])
        first, _ = self._invoke(
            contender, _task(scenario), dest, tag + "-killed", kill_after=int(total * RESUME_AT)
        )
        killed_at = first.written_at_kill / total if first.killed else 1.0
        os.sync()
        m, traffic = self._invoke(contender, _task(scenario, rerun=True), dest, tag)
        self._record(scenario, contender, slot, m, dest, traffic, killed_at=killed_at)
        self._clean(dest)

    # -- second TrainJob: a warm asset store against every peer's fresh fetch ----------------
    def _second_trainjob(self, scenario: str, contenders: list[Contender], rounds: int) -> None:
        """One run of ours fills the asset store (``CACHE_DIR``); then, in paired rounds, ours
        links a new workspace's ``--output`` to the entry while each peer, which has no shared
        store, fetches the asset into its new workspace as in the cold scenarios."""
        task = _task(scenario)
        playing = {c.name: c for c in contenders if c.applies(task)}
        if "ours" not in playing:
            self.log(f"{scenario}: left out, it measures ours with an asset store")
            return
        names = list(playing)
        cache = self.ctx.scratch / "asset-store"
        workspaces = self.out / "workspaces"
        _remove(cache)
        shutil.rmtree(workspaces, ignore_errors=True)
        ours_task = dataclasses.replace(task, cache=cache)
        self.log(f"{scenario}: {', '.join(names)}; {rounds} round(s), paired with ours, order "
                 "alternating; ours with the asset store one earlier run filled")  # fmt: skip
        first = workspaces / "first-trainjob" / task.asset
        first.parent.mkdir(parents=True)
        m, _ = self._invoke(playing["ours"], ours_task, first, f"{scenario}-fill-store")
        problems = verify.check(first, self.ctx.fixture, task.asset)
        if m.returncode or problems or not first.is_symlink():
            self.log(f"  {scenario}: filling the asset store failed, no rounds: "
                     f"exit {m.returncode}, {problems}")  # fmt: skip
            _remove(cache)
            return
        shutil.rmtree(first.parent)
        os.sync()
        for i, slot in enumerate(schedule.paired(names, rounds)):
            contender = playing[slot.contender]
            tag = f"{scenario}-{i:03d}-r{slot.round}-{contender.name}"
            workspace = workspaces / f"{i:03d}-{contender.name}"  # a new TrainJob's workspace
            workspace.mkdir(parents=True)
            dest = workspace / task.asset
            self._clean(dest)  # also HF_HOME, and the sync
            ours = contender.name == "ours"
            m, traffic = self._invoke(contender, ours_task if ours else task, dest, tag)
            found = []
            if ours and not (dest.is_symlink() and dest.resolve().is_relative_to(cache)):
                found.append("--output is not a link into the asset store")
            self._record(scenario, contender, slot, m, dest, traffic, problems=found)
            shutil.rmtree(workspace, ignore_errors=True)  # a link, or a fetched tree
            os.sync()
        shutil.rmtree(workspaces, ignore_errors=True)
        _remove(cache)

    # -- sharding: K processes of ours, each behind its own capped proxy ----------------------
    def _shards(self, scenario: str, contenders: list[Contender], rounds: int) -> None:
        """K = 1, 2, 4 processes of ours into one destination, shard i's ``ENDPOINT`` a proxy of
        its own capped at ``shard_cap_mib_s`` in front of nginx; and K = 4 through proxies
        without a cap, to show what the same path does when the cap is lifted."""
        ours = next((c for c in contenders if isinstance(c, Ours)), None)
        if ours is None:
            self.log(f"{scenario}: left out, it measures ours")
            return
        task = _task(scenario)
        top = max(SHARD_COUNTS)
        cap = self.shard_cap_mib_s
        variants: dict[str, tuple[int, float | None]] = {
            shard_variant(k): (k, cap) for k in SHARD_COUNTS
        }
        variants[shard_variant(top, capped=False)] = (top, None)
        names = list(variants)
        self.log(f"{scenario}: {', '.join(names)}; {rounds} round(s), forwards and backwards "
                 f"in turn; {cap:g} MiB/s per shard")  # fmt: skip
        with contextlib.ExitStack() as stack:
            proxies = {
                limit: [
                    stack.enter_context(
                        RateProxy(self.endpoints.s3_url, limit, self.ctx.scratch / "proxies")
                    )
                    for _ in range(top)
                ]
                for limit in (cap, None)
            }
            for i, slot in enumerate(schedule.alternating(names, rounds)):
                count, limit = variants[slot.contender]
                tag = f"{scenario}-{i:03d}-r{slot.round}-{slot.contender}"
                self._sharded_run(scenario, ours, task, slot, tag, proxies[limit][:count], limit)

    def _sharded_run(
        self, scenario: str, ours: Ours, task: Task, slot: schedule.Slot, tag: str,
        proxies: list[RateProxy], cap: float | None,
    ) -> None:  # fmt: skip
        dest = self.runs / tag
        self._clean(dest)
        logs = self.out / "logs" / tag
        inv = ours.sharded(self.ctx, task, dest, [p.url for p in proxies], run=tag, logs=logs)
        servers = self.endpoints.s3_server_pids()
        proxy_pids = [p.proc.pid for p in proxies if p.proc is not None]
        proxy_before, servers_before = _cpu_s(proxy_pids), _cpu_s(servers)
        m, traffic = self._measure(inv, self.ctx, task, tag)
        proxy_cpu = _cpu_s(proxy_pids) - proxy_before
        server_cpu = _cpu_s(servers) - servers_before
        self._record(
            scenario, slot.contender, slot, m, dest, traffic,
            problems=verify.check_manifest(dest, self.ctx.fixture, task.asset),
            shards=len(proxies), cap_mib_s=cap, proxy_cpu_s=round(proxy_cpu, 3),
            path_cpu_s=round(m.cpu_s + proxy_cpu + server_cpu, 3),
        )  # fmt: skip
        self._clean(dest)

    def save(self, path: Path, meta: dict) -> None:
        body = {"meta": meta, "records": [asdict(r) for r in self.records]}
        path.write_text(json.dumps(body, indent=1))

"""Turn a results file into the markdown tables and the PNG chart committed under docs/.

Cold and latency scenarios compare ours with each peer by the median of their per-round ratios
(:mod:`benchmarks.ratios`); warm and resume show absolute figures; the second-TrainJob tables
compare ours with a warm asset store with every peer's fresh fetch, by the same ratios; the
sharding table shows the aggregate throughput per number of shards and its ratio to K times one
shard's, round by round. Results saved before the paired rounds (no ``pair`` in their records)
still render, with no ratios.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from benchmarks import ratios, schedule
from benchmarks.contenders import ALL
from benchmarks.machine import describe_commit
from benchmarks.method import method

MiB = 1 << 20
KiB = 1 << 10
TIMES, DASH = "\u00d7", "\u2013"  # multiplication sign, en dash
LABELS = {c.name: c.label for c in ALL}
REFERENCES = {c.name for c in ALL if c.reference}
SOURCES = {
    "s3": "S3",
    "s3nginx": "S3 with nginx's ETags, no checksums",
    "s3tls": "S3 over HTTPS",
    "hf": "Hub",
    "gcs": "GCS (fake-gcs-server)",
    "az": "Azure Blob (Azurite)",
}
PAIRED_KINDS = schedule.PAIRED_KINDS
parts = schedule.parts
# First data GET goals on this machine class, per source (issue 13).
FIRST_GET_GOALS = {"s3": 0.25, "hf": 0.4}
SECOND_TRAINJOB_GOAL_S = 1.0  # issue 15: ours into a new workspace with a warm asset store
MANY = schedule.MANY_FILES_SCENARIO  # 100,000 small objects: no target, per-file costs
SHARDING_GOAL = 0.8  # issue 16: aggregate(K) >= 0.8 x K x aggregate(1)
DURABLE_GOAL = 1.10  # issue 40: ours --durable within 10% of the disk floor measured alongside


@dataclass
class Summary:
    """Medians over the runs of one contender in one scenario."""

    contender: str
    runs: int
    ok_runs: int
    wall_s: float
    mib_s: float
    peak_rss_mib: float  # the highest of the runs
    cpu_s: float
    data_mib: float
    killed_at: float | None
    first_get_s: float | None = None  # median over the runs that made a data GET
    vs_ours: ratios.PairedRatio | None = None  # paired kinds: this peer's time over the anchor's
    note: str = ""  # the first problem of a failed run, if any


def _median_or_none(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def summarize(results: dict) -> dict[str, dict[str, Summary]]:
    """scenario -> contender -> Summary, in the order the contenders were listed."""
    assets = results["meta"]["assets"]
    grouped: dict[str, dict[str, list[dict]]] = {}
    for rec in results["records"]:
        grouped.setdefault(rec["scenario"], {}).setdefault(rec["contender"], []).append(rec)
    out: dict[str, dict[str, Summary]] = {}
    for scenario, by_contender in grouped.items():
        total = assets[parts(scenario)[2]]["bytes"]
        every = [r for recs in by_contender.values() for r in recs]
        anchor = schedule.anchor_of(parts(scenario)[0])
        out[scenario] = {}
        for name, recs in by_contender.items():
            wall = statistics.median(r["wall_s"] for r in recs)
            kills = [r["killed_at"] for r in recs if r.get("killed_at") is not None]
            firsts = [r["first_get_s"] for r in recs if r.get("first_get_s") is not None]
            out[scenario][name] = Summary(
                contender=name,
                runs=len(recs),
                ok_runs=sum(r["ok"] for r in recs),
                wall_s=wall,
                mib_s=total / MiB / wall if wall else 0.0,
                peak_rss_mib=max(r["peak_rss_mib"] for r in recs),
                cpu_s=statistics.median(r["cpu_s"] for r in recs),
                data_mib=statistics.median(r["data_bytes"] for r in recs) / MiB,
                killed_at=_median_or_none(kills),
                first_get_s=_median_or_none(firsts),
                vs_ours=None if name == anchor else ratios.paired_ratio(every, name, anchor),
                note=next((r["problems"][0] for r in recs if r["problems"]), ""),
            )
    return out


def fmt_ratio(r: ratios.PairedRatio | None) -> str:
    """Median (low-high, rounds), e.g. ``1.23x (1.10-1.40, 5 rounds)``; a dash without a pair."""
    if r is None:
        return DASH
    rounds = f"{r.rounds} round" + ("s" if r.rounds != 1 else "")
    return f"{r.median:.2f}{TIMES} ({r.low:.2f}{DASH}{r.high:.2f}, {rounds})"


def _fmt_seconds(s: float | None) -> str:
    return DASH if s is None else f"{s:.2f}"


def title(scenario: str, meta: dict) -> str:
    kind, source, asset = parts(scenario)
    shown = "many small files" if asset == schedule.MANY_FILES else asset
    where = f"{SOURCES.get(source, source)}, {shown}"
    if kind == "cold":
        return f"Cold fetch, {where}"
    if kind == "latency":
        ms = meta.get("latency_s", 0.02) * 1000
        return f"Latency: cold fetch, {where}, {ms:g} ms before every response's first byte"
    if kind == "durable":
        return f"Durable fetch (every file synced before the exit), {where}, against the disk"
    if kind == "second-trainjob":
        return f"Second TrainJob: the same {asset} into a new workspace, {SOURCES.get(source)}"
    if kind == "shards":
        cap = meta.get("shard_cap_mib_s")
        each = f", each shard behind its own {cap:g} MiB/s proxy" if cap else ""
        return f"Sharding: one {asset} fetched by K processes of ours, {where}{each}"
    return scenario


def fmt_bytes(n: float) -> str:
    """``0 B``, ``7.0 KiB``, ``2,051.0 MiB``."""
    if n < 1024:
        return f"{n:.0f} B"
    if n < MiB:
        return f"{n / 1024:.1f} KiB"
    return f"{n / MiB:,.1f} MiB"


def _paired_table(scenario: str, rows: dict[str, Summary], meta: dict) -> list[str]:
    asset = meta["assets"][parts(scenario)[2]]
    anchor = schedule.anchor_of(parts(scenario)[0])
    lines = [
        f"### {title(scenario, meta)} ({asset['files']} files, {asset['bytes'] / MiB:,.0f} MiB)",
        "",
        f"| contender | median wall (s) | MiB/s | {anchor} vs it: its time / {anchor}, median of "
        f"rounds (min{DASH}max) | first data GET (s) | peak RSS (MiB) | CPU (s) | runs ok |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, s in sorted(rows.items(), key=lambda kv: (kv[0] in REFERENCES, kv[1].wall_s)):
        label = f"**{LABELS.get(name, name)}**" if name == anchor else LABELS.get(name, name)
        vs = "" if name == anchor else fmt_ratio(s.vs_ours)
        lines.append(
            f"| {label} | {s.wall_s:.2f} | {s.mib_s:,.0f} | {vs} | {_fmt_seconds(s.first_get_s)} "
            f"| {s.peak_rss_mib:,.0f} | {s.cpu_s:.1f} | {s.ok_runs}/{s.runs} |"
        )
    return [*lines, ""]


def _targets(summary: dict[str, dict[str, Summary]], results: dict) -> list[str]:
    assets = results["meta"]["assets"]

    def get(scenario: str, name: str) -> Summary | None:
        return summary.get(scenario, {}).get(name)

    rows: list[tuple[str, str, bool | None]] = []

    def ratio_row(what: str, scenario: str, other: str, goal: float) -> None:
        s = get(scenario, other)
        r = s.vs_ours if s else None
        met = None if r is None else r.median >= goal
        rows.append((f"{what} ≥ {goal:g}{TIMES}", fmt_ratio(r), met))

    ratio_row("S3 model vs s5cmd", "cold-s3-model", "s5cmd", 1.0)
    ratio_row("S3 model vs Kubeflow S3 initializer", "cold-s3-model", "kubeflow-s3", 3.0)
    ratio_row("S3 dataset vs s5cmd", "cold-s3-dataset", "s5cmd", 1.0)
    ratio_row("S3 model, nginx ETags, vs s5cmd", "cold-s3nginx-model", "s5cmd", 1.0)
    ratio_row("S3 dataset, nginx ETags, vs s5cmd", "cold-s3nginx-dataset", "s5cmd", 1.0)
    ratio_row("S3 model over HTTPS vs s5cmd", "cold-s3tls-model", "s5cmd", 1.0)
    ratio_row("S3 dataset over HTTPS vs s5cmd", "cold-s3tls-dataset", "s5cmd", 1.0)
    ratio_row("Hub model vs snapshot_download", "cold-hf-model", "hf-snapshot", 2.5)
    ratio_row("Hub dataset vs snapshot_download", "cold-hf-dataset", "hf-snapshot", 6.0)
    ratio_row("Hub model vs HfApi listing + obstore script", "cold-hf-model", "hf-obstore", 1.0)
    ratio_row("Hub dataset vs HfApi listing + obstore script", "cold-hf-dataset", "hf-obstore", 1.0)
    ratio_row("Latency S3 dataset vs s5cmd", "latency-s3-dataset", "s5cmd", 1.0)
    ratio_row("GCS model vs google-cloud-storage transfer manager", "cold-gcs-model", "gcs-tm", 1.0)
    ratio_row("Azure model vs azure-storage-blob download_blob", "cold-az-model", "azure-blob", 1.0)
    for source, goal in FIRST_GET_GOALS.items():
        firsts = [
            (s["ours"].first_get_s, scenario)
            for scenario, s in summary.items()
            if scenario.startswith(f"cold-{source}-") and scenario != MANY and "ours" in s
            if s["ours"].first_get_s is not None
        ]
        if firsts:
            worst, where = max(firsts)
            rows.append(
                (
                    f"First data GET of ours ≤ {goal:g} s after start, {SOURCES[source]}",
                    f"{worst:.2f} s ({where})",
                    worst <= goal,
                )
            )
    # The many-files scenario has no target: its memory grows with the number of files.
    peaks = [s["ours"].peak_rss_mib for n, s in summary.items() if "ours" in s and n != MANY]
    if peaks:
        rows.append(("Peak RSS of ours ≤ 200 MiB", f"{max(peaks):.0f} MiB", max(peaks) <= 200))
    many = get(MANY, "ours")
    if many:
        files = assets.get(schedule.MANY_FILES, {}).get("files", 0)
        per_file = f", {many.peak_rss_mib * MiB / files / KiB:.1f} KiB a file" if files else ""
        s5 = get(MANY, "s5cmd")
        rows.append((f"{MANY} vs s5cmd (no target)", fmt_ratio(s5.vs_ours if s5 else None), None))
        rows.append(
            (
                f"{MANY}: peak RSS of ours (no target)",
                f"{many.peak_rss_mib:.0f} MiB{per_file}",
                None,
            )
        )
        first = _fmt_seconds(many.first_get_s)
        rows.append((f"{MANY}: first data GET of ours (no target)", f"{first} s", None))
    for scenario in ("warm-s3-model", "warm-hf-model"):
        s = get(scenario, "ours")
        if s:
            good = s.wall_s <= 1.0 and s.data_mib == 0
            rows.append(
                (f"{scenario}: ≤ 1 s, 0 bytes", f"{s.wall_s:.2f} s, {s.data_mib:.1f} MiB", good)
            )
    for scenario in ("resume-s3-model", "resume-hf-model"):
        s = get(scenario, "ours")
        if s:
            share = s.data_mib * MiB / assets["model"]["bytes"]
            rows.append((f"{scenario}: rerun fetches ≤ 60%", f"{share:.0%}", share <= 0.60))
    floor = get("durable-s3-model", "disk-floor")
    if floor and floor.vs_ours:  # the floor's time over the durable run's, per round
        slower = 1 / floor.vs_ours.median
        rows.append(
            (
                f"S3 model, ours --durable ≤ {DURABLE_GOAL:g} {TIMES} the disk floor "
                "(dd conv=fdatasync of the same files, same rounds)",
                f"{slower:.2f}{TIMES} ({1 / floor.vs_ours.high:.2f}{DASH}"
                f"{1 / floor.vs_ours.low:.2f}, {floor.vs_ours.rounds} rounds)",
                slower <= DURABLE_GOAL,
            )
        )
    rows += _second_trainjob_targets(results["records"])
    rows += _sharding_targets(results)
    lines = ["| target | measured | met |", "|---|---:|:---:|"]
    for what, value, met in rows:
        verdict = DASH if met is None else ("yes" if met else "**no**")
        lines.append(f"| {what} | {value} | {verdict} |")
    return [*lines, ""]


def _rerun_tables(summary: dict[str, dict[str, Summary]], assets: dict) -> list[str]:
    lines: list[str] = []
    warm = [s for s in summary if s.startswith("warm-")]
    if warm:
        lines += [
            "### Warm rerun into a complete destination",
            "",
            "| scenario | contender | median wall (s) | file bytes fetched (MiB) | runs ok "
            "| note |",
            "|---|---|---:|---:|---:|---|",
        ]
        for scenario in warm:
            for name, s in sorted(summary[scenario].items(), key=lambda kv: kv[1].wall_s):
                lines.append(
                    f"| {scenario} | {LABELS.get(name, name)} | {s.wall_s:.2f} | "
                    f"{s.data_mib:,.1f} | {s.ok_runs}/{s.runs} | {s.note} |"
                )
        lines.append("")
    resume = [s for s in summary if s.startswith("resume-")]
    if resume:
        lines += [
            "### Resume after a kill at about half way",
            "",
            "| scenario | contender | killed at | rerun wall (s) | rerun fetched | runs ok "
            "| note |",
            "|---|---|---:|---:|---:|---:|---|",
        ]
        for scenario in resume:
            total = assets[scenario.split("-")[2]]["bytes"]
            for name, s in sorted(summary[scenario].items(), key=lambda kv: kv[1].data_mib):
                killed = DASH if s.killed_at is None else f"{s.killed_at:.0%}"
                lines.append(
                    f"| {scenario} | {LABELS.get(name, name)} | {killed} | {s.wall_s:.2f} | "
                    f"{s.data_mib * MiB / total:.0%} | {s.ok_runs}/{s.runs} | {s.note} |"
                )
        lines.append("")
    return lines


def _of(records: list[dict], scenario: str) -> dict[str, list[dict]]:
    """One scenario's records by contender, in the order they ran."""
    out: dict[str, list[dict]] = {}
    for rec in records:
        if rec["scenario"] == scenario:
            out.setdefault(rec["contender"], []).append(rec)
    return out


def _scenarios(records: list[dict], kind: str) -> list[str]:
    return list(dict.fromkeys(r["scenario"] for r in records if parts(r["scenario"])[0] == kind))


# -- second TrainJob ---------------------------------------------------------------------------
def _second_trainjob_targets(records: list[dict]) -> list[tuple[str, str, bool | None]]:
    rows: list[tuple[str, str, bool | None]] = []
    for scenario in _scenarios(records, "second-trainjob"):
        ours = [r for r in _of(records, scenario).get("ours", []) if r["ok"]]
        _kind, source, asset = parts(scenario)
        what = (
            f"second TrainJob, warm cache ({SOURCES[source]} {asset}): "
            f"≤ {SECOND_TRAINJOB_GOAL_S:g} s, 0 bytes"
        )
        if not ours:
            rows.append((what, "no run passed its check", False))
            continue
        wall = statistics.median(r["wall_s"] for r in ours)
        fetched = max(r["data_bytes"] for r in ours)
        value = f"{wall:.2f} s (median), {fmt_bytes(fetched)} of file data (most of any run)"
        rows.append((what, value, wall <= SECOND_TRAINJOB_GOAL_S and fetched == 0))
    return rows


def _second_trainjob_table(scenario: str, results: dict) -> list[str]:
    meta, records = results["meta"], results["records"]
    asset = meta["assets"][parts(scenario)[2]]
    by = _of(records, scenario)
    every = [r for recs in by.values() for r in recs]
    lines = [
        f"### {title(scenario, meta)} ({asset['files']} files, {asset['bytes'] / MiB:,.0f} MiB)",
        "",
        "Ours with `CACHE_DIR`: the asset store was filled once, before the rounds, by one run "
        "of ours; each run's `--output` is a new folder in a new, empty workspace, which ours "
        "makes a link to the store's entry after listing the source and checking read access "
        "(a HEAD: no body). The peers have no shared store: each run is their usual cold fetch "
        "into the new workspace. Bytes are counted by nginx, for the measured run only.",
        "",
        "| contender | median wall (s) | file data fetched | all bytes served (listings, API, "
        "HEADs) | requests | ours vs it: its time / ours, median of rounds "
        f"(min{DASH}max) | CPU (s) | peak RSS (MiB) | runs ok |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def wall(name: str) -> float:
        return statistics.median(r["wall_s"] for r in by[name])

    for name in sorted(by, key=lambda n: (n != "ours", n in REFERENCES, wall(n))):
        recs = by[name]
        label = LABELS.get(name, name)
        label = f"**{label}, warm asset store**" if name == "ours" else f"{label}, fresh fetch"
        vs = "" if name == "ours" else fmt_ratio(ratios.paired_ratio(every, name))
        med = statistics.median
        asked = any(r["requests"] for r in recs)  # the disk copy asks nginx for nothing
        fetched = fmt_bytes(med(r["data_bytes"] for r in recs)) if asked else DASH
        served = fmt_bytes(med(r.get("served_bytes", 0) for r in recs)) if asked else DASH
        lines.append(
            f"| {label} | {wall(name):.2f} | {fetched} | {served} "
            f"| {med(r['requests'] for r in recs):.0f} | {vs} "
            f"| {med(r['cpu_s'] for r in recs):.1f} "
            f"| {max(r['peak_rss_mib'] for r in recs):,.0f} "
            f"| {sum(r['ok'] for r in recs)}/{len(recs)} |"
        )
    return [*lines, ""]


# -- sharding ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class ShardFigures:
    """One sharding variant over the rounds."""

    name: str
    shards: int
    cap_mib_s: float | None
    runs: list[dict]  # in round order
    aggregate: list[float]  # MiB/s of each passing run
    scaling: ratios.PairedRatio | None  # aggregate(K) / (K x aggregate(1)), per round


def shard_figures(scenario: str, results: dict) -> list[ShardFigures]:
    """The variants of one sharding scenario, fewest shards first, the uncapped one last."""
    total = results["meta"]["assets"][parts(scenario)[2]]["bytes"] / MiB
    by = _of(results["records"], scenario)
    one = {
        r["run"]: r
        for recs in by.values()
        for r in recs
        if r.get("shards") == 1 and r.get("cap_mib_s") and r["ok"]
    }
    out = []
    for name, recs in by.items():
        count, cap = recs[0].get("shards") or 1, recs[0].get("cap_mib_s")
        passed = [r for r in recs if r["ok"] and r["wall_s"] > 0]
        scaling = None
        if cap and count > 1:
            per_round = [
                one[r["run"]]["wall_s"] / (count * r["wall_s"]) for r in passed if r["run"] in one
            ]
            scaling = ratios.summarize(per_round)
        out.append(
            ShardFigures(name, count, cap, recs, [total / r["wall_s"] for r in passed], scaling)
        )
    return sorted(out, key=lambda f: (f.cap_mib_s is None, f.shards))


def _sharding_targets(results: dict) -> list[tuple[str, str, bool | None]]:
    rows: list[tuple[str, str, bool | None]] = []
    for scenario in _scenarios(results["records"], "shards"):
        for f in shard_figures(scenario, results):
            if f.cap_mib_s is None or f.shards == 1:
                continue
            what = f"sharding: aggregate ≥ {SHARDING_GOAL:g} {TIMES} K {TIMES} one capped shard"
            met = None if f.scaling is None else f.scaling.median >= SHARDING_GOAL
            rows.append((f"{what}, K={f.shards}", fmt_ratio(f.scaling), met))
    return rows


def _range(values: list[float], digits: int = 1) -> str:
    """``median (min-max)`` (with an en dash), or a dash."""
    if not values:
        return DASH
    med, low, high = statistics.median(values), min(values), max(values)
    return f"{med:,.{digits}f} ({low:,.{digits}f}{DASH}{high:,.{digits}f})"


def _shards_table(scenario: str, results: dict) -> list[str]:
    meta = results["meta"]
    asset = meta["assets"][parts(scenario)[2]]
    cpus = meta["machine"].get("cpus", 1) or 1
    figures = shard_figures(scenario, results)
    lines = [
        f"### {title(scenario, meta)} ({asset['files']} files, {asset['bytes'] / MiB:,.0f} MiB)",
        "",
        "Each K: K processes of ours (`SHARDS=K`, `JOB_COMPLETION_INDEX=i`, one `--output`) "
        "started together, each shard's `ENDPOINT` its own proxy in front of nginx; wall time "
        "until the last one exits; the tree and its one manifest checked after every run. "
        "Aggregate = the asset's bytes over that wall time. The scaling column is, round by "
        f"round, aggregate(K) / (K {TIMES} aggregate(1)): 1 is perfect scaling.",
        "",
        "| shards (K) | cap per shard | median wall (s) | aggregate MiB/s, median (min"
        f"{DASH}max) | per shard (MiB/s) | aggregate(K) / (K {TIMES} aggregate(1)), median of "
        f"rounds (min{DASH}max) | proxies' CPU (% of one CPU) | CPU of ours + proxies + nginx "
        f"(% of {cpus} CPUs) | peak RSS (MiB) | file data fetched (MiB) | runs ok |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    med = statistics.median
    for f in figures:
        recs = f.runs
        walls = [r["wall_s"] for r in recs]
        proxy = [100 * r["proxy_cpu_s"] / r["wall_s"] for r in recs if r.get("proxy_cpu_s")]
        path = [100 * r["path_cpu_s"] / (r["wall_s"] * cpus) for r in recs if r.get("path_cpu_s")]
        cap = DASH + " (no cap, reference)" if f.cap_mib_s is None else f"{f.cap_mib_s:g} MiB/s"
        per_shard = DASH if not f.aggregate else f"{med(f.aggregate) / f.shards:,.1f}"
        scaling = DASH if f.cap_mib_s is None or f.shards == 1 else fmt_ratio(f.scaling)
        lines.append(
            f"| {f.shards} | {cap} | {med(walls):.2f} | {_range(f.aggregate)} | {per_shard} "
            f"| {scaling} | {_range(proxy, 0)} | {_range(path, 0)} "
            f"| {max(r['peak_rss_mib'] for r in recs):,.0f} "
            f"| {med(r['data_bytes'] for r in recs) / MiB:,.1f} "
            f"| {sum(r['ok'] for r in recs)}/{len(recs)} |"
        )
    lines.append("")
    capped = {f.shards: f for f in figures if f.cap_mib_s and f.aggregate}
    free = next((f for f in figures if f.cap_mib_s is None and f.aggregate), None)
    if free is not None and free.shards in capped:
        uncapped, limited = med(free.aggregate), capped[free.shards]
        caps = free.shards * (limited.cap_mib_s or 0)
        headroom = uncapped / caps
        verdict = (
            "so at the cap the shared nginx, the proxies and the CPUs are not what bounds the "
            "shards: the cap is"
            if headroom >= 1.5
            else "too close to the cap to call the CPUs idle: the scaling above may be understated"
        )
        lines += [
            f"Without the cap, the same {free.shards} processes through the same kind of proxies "
            f"reach {uncapped:,.0f} MiB/s (median), {headroom:.1f}{TIMES} the {free.shards} caps "
            f"together ({caps:g} MiB/s), {verdict}.",
            "",
        ]
    return lines


def _commit_line(meta: dict) -> str:
    info = meta.get("commit")
    if not info:  # results saved before the commit was recorded
        return "**Commit measured**: not recorded (see kf-initializers under Versions)."
    return f"**Commit measured**: `{describe_commit(info)}`."


OCI_POINTER = (
    "### OCI registry (`oci://`): a ModelPack artifact and a modelcar\n\n"
    "Measured by its own benchmark, `make bench-oci`, against `skopeo copy` + extraction and "
    "oras-py on a local Distribution registry: [benchmarks-oci.md](benchmarks-oci.md)."
)


def markdown(results: dict) -> str:
    meta = results["meta"]
    assets = meta["assets"]
    summary = summarize(results)
    m = meta["machine"]
    rounds = meta.get("rounds", meta.get("runs", 0))
    lines = [
        "# Benchmarks",
        "",
        f"Figures printed by `{meta['command']}` on {meta['date']}; every number below comes",
        "from that run (`benchmarks/`, see its README to reproduce). Chart: "
        "[benchmarks.png](benchmarks.png).",
        "",
        _commit_line(meta),
        "",
        "![MiB/s per contender](benchmarks.png)",
        "",
        f"**Machine**: {m['cpus']} CPUs ({m['cpu_model']}), {m['memory_gib']} GiB RAM, "
        f"{m['os']}, kernel {m['kernel']}, {m['python']}."
        + (
            f" Load average when the run ended: {' / '.join(map(str, m['load_average']))}"
            " (1/5/15 min); above about 1 the machine was not quiet and the figures are noisy."
            if "load_average" in m
            else ""
        )
        + (f" Free memory: {m['free_pages']}." if "free_pages" in m else "")
        + (f" Destinations: {m['destinations']}." if "destinations" in m else ""),
        "",
        "**Versions**: " + ", ".join(f"{k} {v}" for k, v in m["versions"].items()) + ".",
        "",
        "## Targets",
        "",
        f"Ratios are the peer's wall time over ours in the same round (above 1{TIMES}: ours is "
        "faster):",
        "the median of the rounds, then the lowest and highest round.",
        "",
        *_targets(summary, results),
        "## Results",
        "",
    ]
    for kind in PAIRED_KINDS:
        for scenario in summary:
            if scenario.startswith(kind + "-"):
                lines += _paired_table(scenario, summary[scenario], meta)
    lines += _rerun_tables(summary, assets)
    for scenario in summary:
        if parts(scenario)[0] == "second-trainjob":
            lines += _second_trainjob_table(scenario, results)
    for scenario in summary:
        if parts(scenario)[0] == "shards":
            lines += _shards_table(scenario, results)
    lines += [OCI_POINTER, ""]
    lines.append(
        method(
            nginx=m["versions"]["nginx"],
            latency_ms=meta.get("latency_s", 0.02) * 1000,
            ds_files=assets["dataset"]["files"],
            scale=meta["scale"],
            rounds=rounds,
            shard_cap_mib_s=meta.get("shard_cap_mib_s", 20.0),
            cpus=m["cpus"],
        )
    )
    return "\n".join(lines)


def chart(results: dict, path: Path) -> None:
    """One panel per cold and latency scenario: MiB/s per contender (median), ours highlighted,
    references hatched, each peer's bar labelled with its median per-round ratio to ours."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    meta = results["meta"]
    summary = summarize(results)
    panels = [s for kind in PAIRED_KINDS for s in summary if s.startswith(kind + "-")]
    if not panels:
        return
    cols = 2 if len(panels) > 1 else 1
    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(7.5 * cols, 3.6 * rows), squeeze=False)
    for ax, scenario in zip(axes.flat, panels, strict=False):
        anchor = schedule.anchor_of(parts(scenario)[0])
        items = sorted(summary[scenario].values(), key=lambda s: s.mib_s)
        names = [LABELS.get(s.contender, s.contender) for s in items]
        colors = [
            "#d62728"
            if s.contender == anchor
            else ("#bbbbbb" if s.contender in REFERENCES else "#1f77b4")
            for s in items
        ]
        bars = ax.barh(names, [s.mib_s for s in items], color=colors)
        for bar, s in zip(bars, items, strict=True):
            if s.contender in REFERENCES:
                bar.set_hatch("//")
            mark = "" if s.ok_runs == s.runs else " (check failed)"
            ratio = "" if s.vs_ours is None else f"  {anchor} {s.vs_ours.median:.2f}{TIMES}"
            ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2,
                    f" {s.mib_s:,.0f}{ratio}{mark}", va="center", fontsize=8)  # fmt: skip
        ax.set_title(title(scenario, meta), fontsize=9)
        ax.set_xlabel("MiB/s (median of runs; higher is better)", fontsize=8)
        ax.tick_params(axis="y", labelsize=8)
        ax.set_xlim(0, max(s.mib_s for s in items) * 1.45)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    m = meta["machine"]
    commit = meta.get("commit")
    at = f", commit {describe_commit(commit)}" if commit else ""
    fig.suptitle(
        f"kf-initializers vs peers — {m['cpus']} CPUs, {m['memory_gib']} GiB, "
        f"scale {meta['scale']:g}, {meta['date']}{at}",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

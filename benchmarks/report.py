"""Turn a results file into the markdown tables and the PNG chart committed under docs/.

Cold and latency scenarios compare ours with each peer by the median of their per-round ratios
(:mod:`benchmarks.ratios`); warm and resume show absolute figures. Results saved before the
paired rounds (no ``pair`` in their records) still render, with no ratios.
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
TIMES, DASH = "\u00d7", "\u2013"  # multiplication sign, en dash
LABELS = {c.name: c.label for c in ALL}
REFERENCES = {c.name for c in ALL if c.reference}
SOURCES = {"s3": "S3", "hf": "Hub", "gcs": "GCS (fake-gcs-server)", "az": "Azure Blob (Azurite)"}
PAIRED_KINDS = schedule.PAIRED_KINDS
# First data GET goals on this machine class, per source (issue 13).
FIRST_GET_GOALS = {"s3": 0.25, "hf": 0.4}


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
    vs_ours: ratios.PairedRatio | None = None  # paired kinds: this peer's time over ours
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
        total = assets[scenario.split("-")[2]]["bytes"]
        every = [r for recs in by_contender.values() for r in recs]
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
                vs_ours=None if name == ratios.ANCHOR else ratios.paired_ratio(every, name),
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
    kind, source, asset = scenario.split("-")
    where = f"{SOURCES.get(source, source)}, {asset}"
    if kind == "cold":
        return f"Cold fetch, {where}"
    if kind == "latency":
        ms = meta.get("latency_s", 0.02) * 1000
        return f"Latency: cold fetch, {where}, {ms:g} ms before every response's first byte"
    return scenario


def _paired_table(scenario: str, rows: dict[str, Summary], meta: dict) -> list[str]:
    asset = meta["assets"][scenario.split("-")[2]]
    lines = [
        f"### {title(scenario, meta)} ({asset['files']} files, {asset['bytes'] / MiB:,.0f} MiB)",
        "",
        "| contender | median wall (s) | MiB/s | ours vs it: its time / ours, median of rounds "
        f"(min{DASH}max) | first data GET (s) | peak RSS (MiB) | CPU (s) | runs ok |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, s in sorted(rows.items(), key=lambda kv: (kv[0] in REFERENCES, kv[1].wall_s)):
        label = f"**{LABELS.get(name, name)}**" if name == "ours" else LABELS.get(name, name)
        vs = "" if name == "ours" else fmt_ratio(s.vs_ours)
        lines.append(
            f"| {label} | {s.wall_s:.2f} | {s.mib_s:,.0f} | {vs} | {_fmt_seconds(s.first_get_s)} "
            f"| {s.peak_rss_mib:,.0f} | {s.cpu_s:.1f} | {s.ok_runs}/{s.runs} |"
        )
    return [*lines, ""]


def _targets(summary: dict[str, dict[str, Summary]], assets: dict) -> list[str]:
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
    ratio_row("Hub model vs snapshot_download", "cold-hf-model", "hf-snapshot", 2.5)
    ratio_row("Hub dataset vs snapshot_download", "cold-hf-dataset", "hf-snapshot", 4.0)
    ratio_row("Latency S3 dataset vs s5cmd", "latency-s3-dataset", "s5cmd", 1.0)
    ratio_row("GCS model vs google-cloud-storage transfer manager", "cold-gcs-model", "gcs-tm", 1.0)
    ratio_row("Azure model vs azure-storage-blob download_blob", "cold-az-model", "azure-blob", 1.0)
    for source, goal in FIRST_GET_GOALS.items():
        firsts = [
            (s["ours"].first_get_s, scenario)
            for scenario, s in summary.items()
            if scenario.startswith(f"cold-{source}-") and "ours" in s
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
    peaks = [s["ours"].peak_rss_mib for s in summary.values() if "ours" in s]
    if peaks:
        rows.append(("Peak RSS of ours ≤ 200 MiB", f"{max(peaks):.0f} MiB", max(peaks) <= 200))
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


def _commit_line(meta: dict) -> str:
    info = meta.get("commit")
    if not info:  # results saved before the commit was recorded
        return "**Commit measured**: not recorded (see kf-initializers under Versions)."
    return f"**Commit measured**: `{describe_commit(info)}`."


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
        ),
        "",
        "**Versions**: " + ", ".join(f"{k} {v}" for k, v in m["versions"].items()) + ".",
        "",
        "## Targets",
        "",
        f"Ratios are the peer's wall time over ours in the same round (above 1{TIMES}: ours is "
        "faster):",
        "the median of the rounds, then the lowest and highest round.",
        "",
        *_targets(summary, assets),
        "## Results",
        "",
    ]
    for kind in PAIRED_KINDS:
        for scenario in summary:
            if scenario.startswith(kind + "-"):
                lines += _paired_table(scenario, summary[scenario], meta)
    lines += _rerun_tables(summary, assets)
    lines.append(
        method(
            nginx=m["versions"]["nginx"],
            latency_ms=meta.get("latency_s", 0.02) * 1000,
            ds_files=assets["dataset"]["files"],
            scale=meta["scale"],
            rounds=rounds,
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
        items = sorted(summary[scenario].values(), key=lambda s: s.mib_s)
        names = [LABELS.get(s.contender, s.contender) for s in items]
        colors = [
            "#d62728"
            if s.contender == "ours"
            else ("#bbbbbb" if s.contender in REFERENCES else "#1f77b4")
            for s in items
        ]
        bars = ax.barh(names, [s.mib_s for s in items], color=colors)
        for bar, s in zip(bars, items, strict=True):
            if s.contender in REFERENCES:
                bar.set_hatch("//")
            mark = "" if s.ok_runs == s.runs else " (check failed)"
            ratio = "" if s.vs_ours is None else f"  ours {s.vs_ours.median:.2f}{TIMES}"
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

"""Turn a results file into the markdown table and the PNG chart committed under docs/."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from benchmarks.contenders import ALL

MiB = 1 << 20
TIMES, DASH = "\u00d7", "\u2013"  # multiplication sign, en dash
LABELS = {c.name: c.label for c in ALL}
REFERENCES = {c.name for c in ALL if c.reference}
BASELINE = {"s3": "s5cmd", "hf": "hf-snapshot"}
TITLES = {
    "cold-s3-model": "Cold fetch, S3, model",
    "cold-s3-dataset": "Cold fetch, S3, dataset",
    "cold-hf-model": "Cold fetch, Hub, model",
    "cold-hf-dataset": "Cold fetch, Hub, dataset",
}


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
    note: str = ""  # the first problem of a failed run, if any


def summarize(results: dict) -> dict[str, dict[str, Summary]]:
    """scenario -> contender -> Summary, in the order the contenders were listed."""
    assets = results["meta"]["assets"]
    grouped: dict[str, dict[str, list[dict]]] = {}
    for rec in results["records"]:
        grouped.setdefault(rec["scenario"], {}).setdefault(rec["contender"], []).append(rec)
    out: dict[str, dict[str, Summary]] = {}
    for scenario, by_contender in grouped.items():
        total = assets[scenario.split("-")[2]]["bytes"]
        out[scenario] = {}
        for name, recs in by_contender.items():
            wall = statistics.median(r["wall_s"] for r in recs)
            kills = [r["killed_at"] for r in recs if r.get("killed_at") is not None]
            out[scenario][name] = Summary(
                contender=name,
                runs=len(recs),
                ok_runs=sum(r["ok"] for r in recs),
                wall_s=wall,
                mib_s=total / MiB / wall if wall else 0.0,
                peak_rss_mib=max(r["peak_rss_mib"] for r in recs),
                cpu_s=statistics.median(r["cpu_s"] for r in recs),
                data_mib=statistics.median(r["data_bytes"] for r in recs) / MiB,
                killed_at=statistics.median(kills) if kills else None,
                note=next((r["problems"][0] for r in recs if r["problems"]), ""),
            )
    return out


def _ratio(a: Summary | None, b: Summary | None) -> float | None:
    if a is None or b is None or not b.mib_s:
        return None
    return a.mib_s / b.mib_s


def _fmt_ratio(r: float | None) -> str:
    return DASH if r is None else f"{r:.2f}{TIMES}"


def _cold_table(scenario: str, rows: dict[str, Summary], asset: dict) -> list[str]:
    source = scenario.split("-")[1]
    base = rows.get(BASELINE[source])
    ours = rows.get("ours")
    vs = "s5cmd" if source == "s3" else "snapshot_download"
    lines = [
        f"### {TITLES.get(scenario, scenario)} "
        f"({asset['files']} files, {asset['bytes'] / MiB:,.0f} MiB)",
        "",
        f"| contender | median wall (s) | MiB/s | vs {vs} | ours vs it | peak RSS (MiB) | CPU (s) "
        "| runs ok |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, s in sorted(rows.items(), key=lambda kv: (kv[0] in REFERENCES, kv[1].wall_s)):
        label = f"**{LABELS.get(name, name)}**" if name == "ours" else LABELS.get(name, name)
        ours_vs = "" if name in ("ours", *REFERENCES) else _fmt_ratio(_ratio(ours, s))
        lines.append(
            f"| {label} | {s.wall_s:.2f} | {s.mib_s:,.0f} | {_fmt_ratio(_ratio(s, base))} | "
            f"{ours_vs} | {s.peak_rss_mib:,.0f} | {s.cpu_s:.1f} | {s.ok_runs}/{s.runs} |"
        )
    return [*lines, ""]


def _targets(summary: dict[str, dict[str, Summary]], assets: dict) -> list[str]:
    def get(scenario: str, name: str) -> Summary | None:
        return summary.get(scenario, {}).get(name)

    rows: list[tuple[str, str, bool | None]] = []

    def ratio_row(what: str, scenario: str, other: str, goal: float) -> None:
        r = _ratio(get(scenario, "ours"), get(scenario, other))
        rows.append((f"{what} ≥ {goal:g}{TIMES}", _fmt_ratio(r), None if r is None else r >= goal))

    ratio_row("S3 model vs s5cmd", "cold-s3-model", "s5cmd", 1.0)
    ratio_row("S3 model vs Kubeflow S3 initializer", "cold-s3-model", "kubeflow-s3", 3.0)
    ratio_row("S3 dataset vs s5cmd", "cold-s3-dataset", "s5cmd", 1.0)
    ratio_row("Hub model vs snapshot_download", "cold-hf-model", "hf-snapshot", 2.5)
    ratio_row("Hub dataset vs snapshot_download", "cold-hf-dataset", "hf-snapshot", 4.0)
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


METHOD = """\
## How it is measured

- **Endpoints** (all on 127.0.0.1, one nginx {nginx}): an S3 endpoint whose object GETs/HEADs are
  plain nginx static files (sendfile, Range, keep-alive) with listings answered by a small Python
  layer (`benchmarks/s3api.py`). Objects carry what a current AWS SDK or CLI upload leaves on S3:
  ETags (MD5, or the multipart `"<md5 of part md5s>-N"` shape above 8 MiB) and a CRC32 additional
  checksum — full-object below 8 MiB, composite (`...-N`, which no whole-file digest reproduces)
  above — returned on whole-object GETs that ask for it (`x-amz-checksum-mode: ENABLED`).
  A Hub endpoint: the project's test Hub (`tests/servers/hub.py`) behind nginx for the API and
  `resolve`, with LFS files redirected to nginx on another port (the CDN).
- **Fixtures**: a model of 8 safetensors shards of about 256 MiB, configs and tokenizer files, plus
  files the model defaults skip (`.bin`, `.h5`, `.msgpack`, `.pth`, README, .gitattributes) in the
  same prefix; a dataset of {ds_files:,} files of 64 KiB to 1 MiB in nested folders.
  Scale {scale:g}.
- **Same work for everyone**: each contender fetches exactly the files the model initializer's
  default patterns select — ours through its defaults, the others through the equivalent
  exclude/allow options. Every run's output tree is checked (exact file set, sizes, bytes compared
  with the source: whole files up to 4 MiB, five 1 MiB windows of larger ones); a run that fails
  the check is marked in "runs ok".
- **Each contender is a separate process tree**, started with a clean environment. Wall time is
  from spawn to exit; CPU is user+sys of the whole tree (`wait4`); peak RSS is the larger of the
  biggest process's high-water mark (GNU time's `%M`, so no process is charged with the harness's
  own memory) and the polled sum of PSS over the live tree (KServe forks a pool of four).
  MiB/s is the asset's size over the median wall time. "File bytes fetched" is counted by nginx
  (object/`resolve`/CDN bodies only, not listings).
- **Order and noise**: contenders are interleaved (A B C, B C A, ...) and medians of {runs} runs are
  compared, since timings on this VM drift with run order. The fixture is read from the page cache
  (it is read once before the runs); the destination is deleted and `sync` is run before each run.
- **Reruns**: `warm` reruns the contender into the complete folder it left itself; `resume` kills
  the contender's process group (SIGKILL) once it has written about half the asset's bytes, then
  reruns it. Reruns use each tool's own way of not repeating work where it has one: `s5cmd sync`
  and `aws s3 sync` skip files whose size and time match; `snapshot_download` (and KServe's `hf://`,
  which calls it) skips complete files, but huggingface_hub 2.x downloads into a per-process
  temporary file, so a partial file starts over; ours skips complete files and continues partial
  ones from their journal. boto3's TransferManager, the Kubeflow S3 initializer and KServe's `s3://`
  fetch everything again. Temporary files a killed tool leaves behind and its rerun does not clean
  up count as a failed check (see "note").
- **References**: `cp` from the fixture folder and eight parallel `curl` processes (each GETting its
  share of the files over one keep-alive connection, following the Hub's redirects) are not S3 or
  Hub clients; they show what this machine does with no client logic at all.
- **Contenders**: the Kubeflow S3 initializer is a faithful minimal re-implementation of its
  approach (`benchmarks/clients/kubeflow_opendal.py`: OpenDAL list, then read each whole object
  into memory and write it, one at a time); the Kubeflow Hugging Face initializers call
  `snapshot_download`, the row of that name. KServe is PyPI `kserve-storage`'s `Storage.download`
  in its own venv; its `hf://` takes model repos only.
"""


def markdown(results: dict) -> str:
    meta = results["meta"]
    assets = meta["assets"]
    summary = summarize(results)
    m = meta["machine"]
    lines = [
        "# Benchmarks",
        "",
        f"Figures printed by `{meta['command']}` on {meta['date']}; every number below comes",
        "from that run (`benchmarks/`, see its README to reproduce). Chart: "
        "[benchmarks.png](benchmarks.png).",
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
        *_targets(summary, assets),
        "## Results",
        "",
    ]
    for scenario in summary:
        if scenario.startswith("cold-"):
            lines += _cold_table(scenario, summary[scenario], assets[scenario.split("-")[2]])
    lines += _rerun_tables(summary, assets)
    lines.append(
        METHOD.format(
            nginx=m["versions"]["nginx"],
            ds_files=assets["dataset"]["files"],
            scale=meta["scale"],
            runs=meta["runs"],
        )
    )
    return "\n".join(lines)


def chart(results: dict, path: Path) -> None:
    """One panel per cold scenario: MiB/s per contender, ours highlighted, references hatched."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = summarize(results)
    cold = [s for s in TITLES if s in summary]
    if not cold:
        return
    cols = 2 if len(cold) > 1 else 1
    rows = (len(cold) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(7 * cols, 3.6 * rows), squeeze=False)
    for ax, scenario in zip(axes.flat, cold, strict=False):
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
            ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {s.mib_s:,.0f}{mark}",
                    va="center", fontsize=8)  # fmt: skip
        ax.set_title(TITLES[scenario], fontsize=10)
        ax.set_xlabel("MiB/s (median of runs; higher is better)", fontsize=8)
        ax.tick_params(axis="y", labelsize=8)
        ax.set_xlim(0, max(s.mib_s for s in items) * 1.25)
    for ax in list(axes.flat)[len(cold) :]:
        ax.axis("off")
    m = results["meta"]["machine"]
    fig.suptitle(
        f"kf-initializers vs peers — {m['cpus']} CPUs, {m['memory_gib']} GiB, "
        f"scale {results['meta']['scale']:g}, {results['meta']['date']}",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

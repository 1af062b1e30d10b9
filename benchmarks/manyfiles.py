"""Memory against the number of files: ours and s5cmd on 10,000 to 1,000,000 small S3 objects.

``python -m benchmarks.manyfiles [--counts 10000 100000 1000000] [--rounds 5]`` runs, for each
count, against the synthetic endpoint (:mod:`benchmarks.synthetic`: no fixture on disk), paired
rounds of a cold fetch by ours (``dataset-initializer``) and by s5cmd, their order alternating,
then ours again on its complete tree (the warm rerun). Each run's peak tree memory, wall time,
delay to its first data GET (from nginx's log) and, for the warm rerun, the object GETs it
made. Then ours through the asset store (``--cache-counts``: a first TrainJob fills the entry,
later ones link it), and ours on a Hub dataset repository of as many files (``--hub-counts``;
the project's test Hub, whose tree listing pages as the real one's does, 1,000 entries a page),
cold and warm.
It prints a table and writes ``results.json`` under ``.bench/results/manyfiles-<time>/``.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import shutil
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks import destinations, measure
from benchmarks.accesslog import parse_line
from benchmarks.machine import commit, describe_commit
from benchmarks.synthetic import BUCKET, PREFIX, endpoint, total_bytes

REPO = Path(__file__).resolve().parent.parent


@dataclass
class Run:
    count: int
    contender: str
    round: int
    wall_s: float
    cpu_s: float
    peak_rss_mib: float
    first_get_s: float | None
    object_gets: int
    returncode: int
    latency_ms: int = 0


def _log_position(log: Path) -> int:
    return log.stat().st_size if log.exists() else 0


def _gets_since(log: Path, position: int, started: float) -> tuple[float | None, int]:
    """(seconds from ``started`` to the first object GET, object GETs) after ``position``."""
    first, count = None, 0
    with open(log, "rb") as stream:
        stream.seek(position)
        for raw in stream:
            entry = parse_line(raw.decode(errors="replace"))
            if entry and entry.method == "GET" and entry.path.startswith(f"/{BUCKET}/{PREFIX}"):
                count += 1
                arrived = entry.arrived - started
                first = arrived if first is None else min(first, arrived)
    return first, count


def _contenders(url: str, dest: Path) -> dict[str, list[str]]:
    venv = Path(sys.executable).parent
    return {
        "ours": [str(venv / "dataset-initializer"), "--output", str(dest)],
        "s5cmd": [
            str(venv / "s5cmd"),
            "--endpoint-url",
            url,
            "--no-sign-request",
            "--log",
            "error",
            "cp",
            f"s3://{BUCKET}/{PREFIX}*",
            f"{dest}/",
        ],
    }


def _run(
    name: str, argv: list[str], env: dict[str, str], work: Path, log: Path
) -> tuple[float, float, float, float | None, int, int]:
    """One run: wall, CPU, peak RSS, first object GET, object GETs, exit code."""
    position = _log_position(log)
    got = measure.run(argv, env, work / f"{name}.log", timeout_s=3600)
    time.sleep(0.2)  # nginx writes a line as a response ends
    first, gets = _gets_since(log, position, got.started_at)
    return got.wall_s, got.cpu_s, got.peak_rss_mib, first, gets, got.returncode


def _env(url: str) -> dict[str, str]:
    return {
        **os.environ,
        "STORAGE_URI": f"s3://{BUCKET}/{PREFIX}",
        "ENDPOINT": url,
        "ANONYMOUS": "true",
        "REGION": "us-east-1",
        "PROGRESS_INTERVAL": "30",
    }


def measure_count(
    count: int, rounds: int, work: Path, kept: destinations.Kept, latency_ms: int = 0
) -> list[Run]:
    """Paired rounds at ``count`` objects; each run's tree is left to ``kept``."""
    runs: list[Run] = []
    # Each run into a fresh folder where ext4 spreads them: a folder emptied and reused met the
    # inodes the run before it had just freed, on every create (benchmarks/destinations.py).
    print(f"  destinations: {destinations.spread(work / 'runs')}", flush=True)
    with endpoint(count, work / "endpoint", latency_ms / 1000) as url:
        log = work / "endpoint" / "access.log"
        env = _env(url)
        for r in range(rounds):
            order = ["ours", "s5cmd"] if r % 2 == 0 else ["s5cmd", "ours"]
            dests = {name: work / "runs" / f"{name}-{r}" for name in order}
            for name in order:
                got = _run(name, _contenders(url, dests[name])[name], env, work, log)
                runs.append(Run(count, name, r, *got, latency_ms))
                _check(name, got[-1], dests[name], count, work)
            got = _run("warm", _contenders(url, dests["ours"])["ours"], env, work, log)
            runs.append(Run(count, "ours-warm", r, *got, latency_ms))
            for dest in dests.values():
                kept.add(dest, count)
    return runs


def local_tree(count: int) -> Path:
    """A folder of ``count`` one-byte files, 1,000 a folder: made once, then reused."""
    root = REPO / ".bench" / f"manyfiles-local-{count}"
    done = root / ".complete"
    if done.exists():
        return root
    shutil.rmtree(root, ignore_errors=True)
    for i in range(count):
        folder = root / f"{i // 1000:04d}"
        if i % 1000 == 0:
            folder.mkdir(parents=True)
        (folder / f"{i:07d}.txt").write_bytes(b"x")
    done.write_bytes(b"")
    return root


def measure_local(count: int, rounds: int, work: Path) -> list[Run]:
    """Ours (``file://``) and ``cp -r`` copying the same folder, paired rounds."""
    source = local_tree(count)
    runs: list[Run] = []
    venv = Path(sys.executable).parent
    for r in range(rounds):
        for name in ["ours-file", "cp"] if r % 2 == 0 else ["cp", "ours-file"]:
            dest = work / f"dest-{name}"
            shutil.rmtree(dest, ignore_errors=True)
            argv = (
                [str(venv / "dataset-initializer"), "--output", str(dest)]
                if name == "ours-file"
                else ["cp", "-r", str(source), str(dest)]
            )
            env = {**os.environ, "STORAGE_URI": f"file://{source}", "PROGRESS_INTERVAL": "30"}
            got = measure.run(argv, env, work / f"{name}.log", timeout_s=3600)
            runs.append(
                Run(
                    count, name, r, got.wall_s, got.cpu_s, got.peak_rss_mib, None, 0, got.returncode
                )
            )
            _check(name, got.returncode, dest, count, work)
            if name == "ours-file" and r == 0:
                runs.append(measure_shim_check(count, dest, work))
        shutil.rmtree(work / "dest-ours-file", ignore_errors=True)
        shutil.rmtree(work / "dest-cp", ignore_errors=True)
    return runs


HUB_REPO = "bench/many"


def measure_hub(count: int, rounds: int, work: Path) -> list[Run]:
    """Ours on a Hub dataset repository of ``count`` one-byte files (the local tree's), served
    by the test Hub in this process: cold, then warm, per round. Its first data GET is the first
    ``resolve`` the Hub received; object GETs count those."""
    from huggingface_hub import HfApi

    from tests.servers.hub import HubServer

    source = local_tree(count)
    files = {str(f.relative_to(source)): f for f in sorted(source.glob("*/*.txt"))}
    venv = Path(sys.executable).parent
    runs: list[Run] = []
    with HubServer() as hub:
        hub.add_repo(HUB_REPO, files, repo_type="dataset")
        # The test Hub builds a commit's tree listing at its first page: once, before the
        # runs, as a real Hub has it indexed already.
        api = HfApi(endpoint=hub.endpoint, token=False)
        next(iter(api.list_repo_tree(HUB_REPO, repo_type="dataset", recursive=True)))
        dest = work / "dest-ours-hub"
        argv = [str(venv / "dataset-initializer"), "--output", str(dest)]
        env = {
            **os.environ, "STORAGE_URI": f"hf://datasets/{HUB_REPO}", "HF_ENDPOINT": hub.endpoint,
            "PROGRESS_INTERVAL": "30", "HF_HUB_DISABLE_TELEMETRY": "1",
        }  # fmt: skip
        for r in range(rounds):
            shutil.rmtree(dest, ignore_errors=True)
            for name in ("ours-hub", "ours-hub-warm"):
                before = len(hub.requests)
                got = measure.run(argv, env, work / f"{name}.log", timeout_s=3600)
                gets = [q.arrived for q in hub.requests[before:] if "/resolve/" in q.path]
                first = min(gets) - got.started_at if gets else None
                runs.append(Run(count, name, r, got.wall_s, got.cpu_s, got.peak_rss_mib, first,
                                len(gets), got.returncode))  # fmt: skip
                _check(name, got.returncode, dest, count, work)
    shutil.rmtree(dest, ignore_errors=True)
    return runs


def measure_shim_check(count: int, dest: Path, work: Path) -> Run:
    """What ``kf-torchrun`` / ``kf-mpirun`` do before training starts: check that the folder
    holds what its manifest says (``wait_for_assets``, their code), on the tree ours wrote."""
    script = (
        "import sys; from pathlib import Path; "
        "from initializers.launchers.assets import wait_for_assets; "
        "wait_for_assets([Path(sys.argv[1])], 0)"
    )
    got = measure.run([sys.executable, "-c", script, str(dest)], dict(os.environ),
                      work / "shim-check.log", timeout_s=600)  # fmt: skip
    if got.returncode != 0:
        raise SystemExit(f"the shims' check failed; see {work / 'shim-check.log'}")
    return Run(count, "shim-check", 0, got.wall_s, got.cpu_s, got.peak_rss_mib, None, 0, 0)


class _ObjectGets:
    """Object GETs the endpoint has logged since ``position``, counted as the log grows (a
    substring count over the new bytes: the harness must not take the CPU it measures)."""

    def __init__(self, log: Path, position: int) -> None:
        self.log, self.position, self.count = log, position, 0
        self._needle = f"GET /{BUCKET}/{PREFIX}".encode()

    def reached(self, wanted: int) -> bool:
        with open(self.log, "rb") as stream:
            stream.seek(self.position)
            chunk = stream.read()
        complete = chunk.rfind(b"\n") + 1  # a line still being written waits for the next poll
        self.count += chunk[:complete].count(self._needle)
        self.position += complete
        return self.count >= wanted


def measure_resume(count: int, work: Path) -> list[Run]:
    """Ours killed (SIGKILL, every process) once the endpoint has served half of the objects,
    then rerun: what the rerun fetches again, and its memory. (Counting the bytes ours wrote
    instead killed it early: its scratch table's writes count too, 40% of the objects at 1M.)"""
    with endpoint(count, work / "endpoint") as url:
        log = work / "endpoint" / "access.log"
        env, dest = _env(url), work / "dest-resume"
        argv = _contenders(url, dest)["ours"]
        position = _log_position(log)
        served = _ObjectGets(log, position)
        killed = measure.run(
            argv, env, work / "killed.log", kill_when=lambda: served.reached(count // 2)
        )
        time.sleep(0.2)
        first, gets = _gets_since(log, position, killed.started_at)
        runs = [
            Run(
                count,
                "ours-killed-at-half",
                0,
                killed.wall_s,
                killed.cpu_s,
                killed.peak_rss_mib,
                first,
                gets,
                killed.returncode,
            )
        ]
        got = _run("resumed", argv, env, work, log)
        runs.append(Run(count, "ours-resumed", 0, *got))
        _check("resumed", got[-1], dest, count, work)
    return runs


def measure_cache(count: int, rounds: int, work: Path) -> list[Run]:
    """Ours with ``CACHE_DIR``: a first TrainJob fills the asset store's entry, then each
    round a later TrainJob (a workspace of its own) links it: what it costs to find the entry
    unchanged, and that it fetches nothing."""
    runs: list[Run] = []
    with endpoint(count, work / "endpoint") as url:
        log = work / "endpoint" / "access.log"
        env = {**_env(url), "CACHE_DIR": str(work / "cache")}
        for r in range(-1, rounds):
            name = "ours-cache-first" if r < 0 else "ours-cache-later"
            dest = work / f"trainjob-{r + 1}" / "dataset"
            got = _run(name, _contenders(url, dest)["ours"], env, work, log)
            runs.append(Run(count, name, max(r, 0), *got))
            _check(name, got[-1], dest, count, work)
    shutil.rmtree(work / "cache", ignore_errors=True)
    return runs


def _check(name: str, code: int, dest: Path, count: int, work: Path) -> None:
    """Every object landed: the run counts only if its tree is right."""
    if code != 0:
        raise SystemExit(f"{name} exited {code}; see {work / (name + '.log')}")
    found = sum(1 for _, _, files in os.walk(dest) for file in files if not file.startswith("."))
    if found != count:
        raise SystemExit(f"{name}: {found} files in {dest}, expected {count}")


def report(runs: list[Run]) -> str:
    lines = [
        "| files | contender | rounds | peak tree RSS MiB (median, range) | wall s (median) "
        "| first GET s (median) | object GETs |",
        "|---:|---|---:|---|---:|---:|---:|",
    ]
    keyed: dict[tuple[int, str], list[Run]] = {}
    for run in runs:
        late = f" @{run.latency_ms} ms" if run.latency_ms else ""
        keyed.setdefault((run.count, run.contender + late), []).append(run)
    for (count, name), group in sorted(keyed.items()):
        rss = [r.peak_rss_mib for r in group]
        firsts = [r.first_get_s for r in group if r.first_get_s is not None]
        lines.append(
            f"| {count:,} | {name} | {len(group)} | {statistics.median(rss):.0f} "
            f"({min(rss):.0f}-{max(rss):.0f}) | {statistics.median(r.wall_s for r in group):.1f} "
            f"| {statistics.median(firsts):.2f} | {group[-1].object_gets:,} |"
            if firsts
            else f"| {count:,} | {name} | {len(group)} | {statistics.median(rss):.0f} "
            f"({min(rss):.0f}-{max(rss):.0f}) | {statistics.median(r.wall_s for r in group):.1f} "
            f"| - | {group[-1].object_gets:,} |"
        )
    return "\n".join([*lines, *_ratios(keyed)]) + "\n"


def _ratios(keyed: dict[tuple[int, str], list[Run]]) -> list[str]:
    """s5cmd's wall time over ours, round by round: the median and its range."""
    found = []
    for (count, name), group in sorted(keyed.items()):
        if not name.startswith(("s5cmd", "cp")):
            continue
        mine = "ours-file" if name == "cp" else name.replace("s5cmd", "ours")
        ours = {r.round: r.wall_s for r in keyed.get((count, mine), [])}
        ratios = sorted(r.wall_s / ours[r.round] for r in group if r.round in ours)
        if ratios:
            late = name.removeprefix("s5cmd").removeprefix("cp")
            peer = "cp -r" if name == "cp" else "s5cmd"
            found.append(
                f"\n{count:,} files{late}: ours {statistics.median(ratios):.2f}x {peer}'s speed "
                f"(range {ratios[0]:.2f}-{ratios[-1]:.2f}, {len(ratios)} paired rounds)"
            )
    for (count, name), group in sorted(keyed.items()):
        if name == "ours-resumed":
            again = group[-1].object_gets
            found.append(
                f"\n{count:,} files, killed at half the objects: the rerun fetched {again:,} "
                f"objects again ({100 * again / count:.1f}%)"
            )
    return found


def chart(runs: list[Run], path: Path) -> None:
    """Peak tree memory against the file count, ours and s5cmd (medians, cold runs and ours'
    warm reruns, no latency): the line should be flat."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6.4, 3.6))
    lines = (("ours", "o-"), ("ours-warm", "s--"), ("s5cmd", "^-"), ("ours-hub", "D:"))
    for name, style in lines:
        points = sorted(
            (count, statistics.median(r.peak_rss_mib for r in group))
            for count in {r.count for r in runs}
            if (
                group := [
                    r for r in runs if r.count == count and r.contender == name and not r.latency_ms
                ]
            )
        )
        if points:
            axes.plot(*zip(*points, strict=True), style, label=name)
    axes.set_xscale("log")
    axes.set_ylim(0, max(220, axes.get_ylim()[1]))
    axes.axhline(200, color="grey", linewidth=0.8, linestyle=":", label="target: 200 MiB")
    axes.set_xlabel("files (S3: 1-8 KiB objects; Hub: one-byte files)")
    axes.set_ylabel("peak tree memory, MiB (median)")
    axes.set_title("Memory against the number of files")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.manyfiles", description=__doc__)
    parser.add_argument("--counts", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--latency-counts", type=int, nargs="*", default=[100_000])
    parser.add_argument(
        "--resume-count", type=int, default=None, help="default: the largest; 0 skips it"
    )
    parser.add_argument(
        "--local-counts",
        type=int,
        nargs="*",
        default=None,
        help="default: the largest; none skips it",
    )
    parser.add_argument("--local-rounds", type=int, default=1)
    parser.add_argument(
        "--cache-counts",
        type=int,
        nargs="*",
        default=None,
        help="CACHE_DIR: a first TrainJob, then later ones; default: the largest; none skips it",
    )
    parser.add_argument("--cache-rounds", type=int, default=3)
    parser.add_argument("--hub-counts", type=int, nargs="*", default=[100_000])
    parser.add_argument("--hub-rounds", type=int, default=1)
    parser.add_argument(
        "--report", type=Path, help="render a saved results.json again (its chart beside it)"
    )
    args = parser.parse_args(argv)
    if args.report:
        saved = [Run(**r) for r in json.loads(args.report.read_text())]
        chart(saved, args.report.with_name("memory.png"))
        print(report(saved))
        return 0
    out = REPO / ".bench" / "results" / f"manyfiles-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True)
    # As make bench: ours does not pay for bytecode compilation (its runs inherit the caller's
    # environment, PYTHONDONTWRITEBYTECODE included, and an edited module's .pyc is stale).
    compileall.compile_dir(REPO / "initializers", quiet=1)
    runs: list[Run] = []
    # Every tree the paired rounds write is kept to the end (up to a budget): removed between
    # scenarios, a million files had the next scenario's first rounds meet them for minutes.
    kept = destinations.Kept()
    for count in args.counts:
        work = out / f"n{count}"
        work.mkdir()
        print(f"{count:,} objects ({total_bytes(count) / (1 << 20):.0f} MiB)...", flush=True)
        runs += measure_count(count, args.rounds, work, kept)
        print(report([r for r in runs if r.count == count]), flush=True)
    for count in args.latency_counts:
        work = out / f"n{count}-latency"
        work.mkdir()
        print(f"{count:,} objects, every response 20 ms late...", flush=True)
        runs += measure_count(count, args.rounds, work, kept, latency_ms=20)
    resume = max(args.counts) if args.resume_count is None else args.resume_count
    if resume:
        work = out / f"n{resume}-resume"
        work.mkdir()
        print(f"{resume:,} objects: killed at half, then resumed...", flush=True)
        runs += measure_resume(resume, work)
        shutil.rmtree(work / "dest-resume", ignore_errors=True)
    for local in [max(args.counts)] if args.local_counts is None else args.local_counts:
        work = out / f"n{local}-local"
        work.mkdir()
        print(f"{local:,} one-byte files from a local folder, ours and cp -r...", flush=True)
        runs += measure_local(local, args.local_rounds, work)
    for count in [max(args.counts)] if args.cache_counts is None else args.cache_counts:
        work = out / f"n{count}-cache"
        work.mkdir()
        print(f"{count:,} objects through CACHE_DIR: a first TrainJob, later ones", flush=True)
        runs += measure_cache(count, args.cache_rounds, work)
    for count in args.hub_counts:
        work = out / f"n{count}-hub"
        work.mkdir()
        print(f"{count:,} one-byte files in a Hub dataset repository, ours...", flush=True)
        runs += measure_hub(count, args.hub_rounds, work)
    kept.clear(settle=False)  # nothing is measured after this
    (out / "results.json").write_text(json.dumps([asdict(r) for r in runs], indent=1))
    reporting = Path("/sys/module/page_reporting/parameters/page_reporting_order")
    head = (
        f"Commit {describe_commit(commit())}, kernel {os.uname().release}, "
        f"page_reporting_order {reporting.read_text().strip() if reporting.exists() else 'n/a'} "
        f"(as found: this benchmark changes no kernel setting), {os.cpu_count()} CPUs.\n\n"
    )
    table = head + report(runs)
    (out / "report.md").write_text(table)
    chart(runs, out / "memory.png")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``python -m benchmarks``: run the side-by-side benchmark and write its report.

A complete run (scale 1, every contender and default scenario, at least 5 rounds) writes
``docs/benchmarks.md`` and ``docs/benchmarks.png``; partial runs write theirs next to the results
under ``.bench/results/`` unless ``--docs DIR`` says where.
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import datetime as dt
import os
import shlex
import shutil
import sys
from pathlib import Path

from benchmarks import cloudemulators, destinations, freepages, harness, latency, machine, report
from benchmarks import contenders as contenders_mod
from benchmarks.endpoints import Endpoints
from benchmarks.fixtures import load_or_generate

REPO_ROOT = Path(__file__).resolve().parent.parent
MIN_COMPLETE_ROUNDS = 5


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    p.add_argument("--scale", type=float, default=1.0, help="fixture size factor (1 = 2 GiB model)")
    p.add_argument(
        "--rounds", "--runs", dest="rounds", type=int, default=MIN_COMPLETE_ROUNDS,
        help="rounds per scenario: in each, ours and every peer run back to back (order "
        "alternating by round); warm and resume run every contender once per round",
    )  # fmt: skip
    p.add_argument(
        "--only",
        help="contenders, comma-separated: " + ", ".join(c.name for c in contenders_mod.ALL),
    )
    p.add_argument(
        "--scenarios",
        help=f"comma-separated <{'|'.join(harness.KINDS)}>-<{'|'.join(harness.SOURCES)}>-"
        "<model|dataset> (gcs and az: cold only, on fake-gcs-server and Azurite; s3nginx and "
        "s3tls: cold only; shards: s3 only), or a bare kind; default: "
        + ",".join(harness.DEFAULT_SCENARIOS),
    )
    p.add_argument(
        "--latency-ms", type=float, default=latency.DEFAULT_DELAY_S * 1000,
        help="latency scenarios: delay before each response's first byte (default %(default)g)",
    )  # fmt: skip
    p.add_argument(
        "--shard-cap", type=float, default=harness.SHARD_CAP_MIB_S, metavar="MIB_S",
        help="sharding scenario: each shard's bandwidth cap, one node's NIC (default %(default)g)",
    )  # fmt: skip
    p.add_argument(
        "--hold-free-pages", action="store_true",
        help="raise the VM's free page reporting order for the session (a tuned variant: by "
        "default the kernel is measured as found, see benchmarks/freepages.py)",
    )  # fmt: skip
    p.add_argument(
        "--idle", type=float, default=0.0, metavar="SECONDS",
        help="pause before each paired run, so it starts on an idle machine (default: back to "
        "back)",
    )  # fmt: skip
    p.add_argument("--bench-dir", type=Path, default=REPO_ROOT / ".bench")
    p.add_argument("--docs", type=Path, help="write benchmarks.md/.png into this folder")
    p.add_argument("--report", type=Path, help="only re-render the report of a results JSON")
    return p


def _warm_page_cache(root: Path) -> None:
    """Read the fixture once so every contender is served from memory, not the first one alone."""
    for folder, _dirs, names in os.walk(root):
        for name in names:
            with open(Path(folder, name), "rb") as f:
                while f.read(8 << 20):
                    pass


def _write_report(results: dict, docs: Path) -> None:
    docs.mkdir(parents=True, exist_ok=True)
    (docs / "benchmarks.md").write_text(report.markdown(results))
    report.chart(results, docs / "benchmarks.png")
    print(f"report: {docs / 'benchmarks.md'} and {docs / 'benchmarks.png'}")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.report:
        import json

        results = json.loads(args.report.read_text())
        _write_report(results, args.docs or args.report.parent)
        return 0
    if shutil.which("nginx") is None and not Path("/usr/sbin/nginx").exists():
        print(
            "nginx is not installed; run `make bench` or benchmarks/setup.sh (they install it)",
            file=sys.stderr,
        )
        return 2
    bench = args.bench_dir.resolve()
    venv, kserve_venv = bench / "venv", bench / "kserve"
    try:
        chosen = contenders_mod.by_names(args.only)
        scenarios = harness.parse_scenarios(args.scenarios)
    except ValueError as exc:
        print(f"python -m benchmarks: {exc}", file=sys.stderr)
        return 2

    if cloudemulators.azurite_missing() and any(harness.parts(s)[1] == "az" for s in scenarios):
        print("warning: Azurite is not installed (`make azurite`, which needs npm): the az:// "
              "scenarios are left out", flush=True)  # fmt: skip
        scenarios = [s for s in scenarios if harness.parts(s)[1] != "az"]
    if args.rounds < 1 or args.latency_ms <= 0 or args.shard_cap <= 0:
        print(
            "python -m benchmarks: --rounds, --latency-ms and --shard-cap must be positive",
            file=sys.stderr,
        )
        return 2
    commit = machine.commit()  # the code measured: taken before ours is frozen below
    load = os.getloadavg()[0]
    if load > 1.0:
        print(f"warning: load average {load:.1f} on {os.cpu_count()} CPUs: other work is running; "
              "figures will be noisy (the report records it)", flush=True)  # fmt: skip
    fixture = load_or_generate(bench, args.scale)
    _warm_page_cache(fixture.data_root)
    os.sync()  # a freshly generated fixture's writeback must not land in the first runs
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = bench / "results" / stamp
    out.mkdir(parents=True, exist_ok=True)
    scratch = bench / "scratch"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)

    # The engine may change while a session runs (it takes a while at full size): measure the
    # code as it was at the start, kept with the results.
    ours_src = out / "src"
    shutil.copytree(REPO_ROOT / "initializers", ours_src / "initializers",
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    compileall.compile_dir(ours_src, quiet=1)  # no contender pays for bytecode compilation
    latency_s = args.latency_ms / 1000
    # The emulators' assets: each is seeded once, with what its scenarios fetch, and only when
    # a chosen contender fetches from it.
    cloud_assets: dict[str, set[str]] = {}
    for scenario in scenarios:
        _kind, source, asset = harness.parts(scenario)
        if source in cloudemulators.SOURCES and any(source in c.sources for c in chosen):
            cloud_assets.setdefault(source, set()).add(asset)
    with contextlib.ExitStack() as stack:
        free_pages = stack.enter_context(
            freepages.reporting_held_back() if args.hold_free_pages else freepages.as_found()
        )
        print(f"free memory: {free_pages}", flush=True)
        placed = destinations.spread(out / "runs")
        print(f"destinations: {placed}", flush=True)
        endpoints = stack.enter_context(
            Endpoints(fixture, bench / "endpoints", latency_s=latency_s)
        )
        clouds = stack.enter_context(
            cloudemulators.CloudEmulators(
                fixture, bench / "emulators", cloud_assets, log=lambda s: print(s, flush=True)
            )
        )
        ctx = contenders_mod.Context(
            fixture, endpoints.s3_url, endpoints.hub_url, venv, kserve_venv, scratch, ours_src
        )
        runner = harness.Harness(
            ctx, endpoints, out, log=lambda s: print(s, flush=True),
            shard_cap_mib_s=args.shard_cap, idle_s=args.idle,
        )  # fmt: skip
        print(f"S3 {endpoints.s3_url}  Hub {endpoints.hub_url}  results {out}", flush=True)
        try:
            for i, scenario in enumerate(scenarios):
                source = harness.parts(scenario)[1]
                if source in cloud_assets:
                    address = clouds.serve(source)  # started and seeded the first time
                    if source == "gcs":
                        ctx.gcs_url = address
                    else:
                        ctx.az_connection_string = address
                runner.run_scenario(scenario, chosen, args.rounds)
                later = any(harness.parts(s)[1] == source for s in scenarios[i + 1 :])
                if source in cloud_assets and not later:
                    clouds.release(source)  # Azurite keeps its blobs in memory
        finally:
            meta = {
                "command": shlex.join(
                    ["python", "-m", "benchmarks", *(sys.argv[1:] if argv is None else argv)]
                ),
                "date": dt.date.today().isoformat(),
                "commit": commit,
                "scale": args.scale,
                "rounds": args.rounds,
                "latency_s": latency_s,
                "shard_cap_mib_s": args.shard_cap,
                "idle_s": args.idle,
                "scenarios": scenarios,
                "contenders": [c.name for c in chosen],
                "assets": {
                    a: {"bytes": fixture.expected_bytes(a), "files": len(fixture.expected(a))}
                    for a in harness.ASSETS
                },
                "machine": machine.describe(venv, kserve_venv)
                | {"free_pages": free_pages, "destinations": placed},
            }
            runner.save(out / "results.json", meta)
    results = {"meta": meta, "records": [r.__dict__ for r in runner.records]}
    print()
    print(report.markdown(results))
    complete = (
        args.scale >= 1
        and args.rounds >= MIN_COMPLETE_ROUNDS
        and args.latency_ms == latency.DEFAULT_DELAY_S * 1000
        and args.shard_cap == harness.SHARD_CAP_MIB_S
        and not args.hold_free_pages
        and not args.idle
        and {c.name for c in chosen} == {c.name for c in contenders_mod.by_names(None)}
        and set(harness.DEFAULT_SCENARIOS) <= set(scenarios)
    )
    _write_report(results, args.docs or (REPO_ROOT / "docs" if complete else out))
    failed = [r for r in runner.records if not r.ok]
    if failed:
        print(f"{len(failed)} run(s) failed their check; see the 'runs ok' column and {out}/logs")
    return 0


if __name__ == "__main__":
    sys.exit(main())

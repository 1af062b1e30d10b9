"""oci:// against its peers: ours, skopeo (then the files extracted), oras-py, on a real registry.

``python -m benchmarks.oci [--rounds 5] [--scale 1]`` starts Debian's ``docker-registry``
(CNCF Distribution 2.8, plain http, no auth, storage under ``.bench/oci-registry/``) on
127.0.0.1 and pushes the benchmark's model (:mod:`benchmarks.fixtures`, only the files the model
initializer selects by default) two ways, with skopeo from OCI layouts written here:

- **artifact**: a CNCF ModelPack artifact, one uncompressed layer per file, each named by
  ``org.cncf.model.filepath`` and ``org.opencontainers.image.title``;
- **modelcar**: an OCI image (KServe's modelcar) whose uncompressed tar layers hold the files
  under ``models/``: one layer for all by default (what KServe's documented ``COPY data/
  /models/`` builds), or one per file (``--modelcar-layers per-file``, what a ``COPY`` per file
  builds: each layer repeats the ``models/`` folder entry, as builders write them).

Then paired rounds (:func:`benchmarks.schedule.paired`: ours and one peer back to back, the order
alternating, the peers rotating) of ``model-initializer --storage-uri oci://...`` against
``skopeo copy`` to ``dir:`` plus the extraction (both layouts) and oras-py's ``pull`` (the
artifact only), each a process tree measured by :mod:`benchmarks.measure` into a fresh folder,
every resulting tree checked file by file (sizes and sha256) against the fixture. It prints a
table and writes ``results.json`` and ``report.md`` under ``.bench/results/oci-<time>/``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil

from benchmarks import destinations, measure, ratios, schedule
from benchmarks.fixtures import Fixture, load_or_generate
from benchmarks.machine import _first_line, _pkg, commit, describe_commit
from benchmarks.verify import ALLOWED_EXTRA
from tests.servers.registry import Registry, binary

REPO = Path(__file__).resolve().parent.parent
CLIENTS = Path(__file__).resolve().parent / "clients"
MiB = 1 << 20
RECORD_FORMAT = 1  # bump when what is pushed changes, so a stale push is redone

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
IMAGE_CONFIG = "application/vnd.oci.image.config.v1+json"
IMAGE_LAYER = "application/vnd.oci.image.layer.v1.tar"
MODEL_CONFIG = "application/vnd.cncf.model.config.v1+json"
MODEL_ARTIFACT = "application/vnd.cncf.model.manifest.v1+json"
MODEL_WEIGHT = "application/vnd.cncf.model.weight.v1.raw"
MODEL_WEIGHT_CONFIG = "application/vnd.cncf.model.weight.config.v1.raw"
FILEPATH, TITLE = "org.cncf.model.filepath", "org.opencontainers.image.title"
TAR_MTIME = 1_700_000_000  # every tar member's: the modelcar's layers are reproducible

LAYOUTS = ("artifact", "modelcar")
CONTENDERS = ("ours", "skopeo", "oras")
LABELS = {
    "ours": "ours (model-initializer)",
    "skopeo": "skopeo copy dir: + extract",
    "oras": "oras-py pull",
}
GOAL_SPEEDUP, GOAL_RSS_MIB = 1.5, 200  # the issue's: ours >= 1.5x the fastest peer, <= 200 MiB
KERNEL_SETTINGS = {
    "page_reporting_order": "/sys/module/page_reporting/parameters/page_reporting_order",
    "vm.dirty_ratio": "/proc/sys/vm/dirty_ratio",
    "vm.dirty_background_ratio": "/proc/sys/vm/dirty_background_ratio",
    "vm.dirty_bytes": "/proc/sys/vm/dirty_bytes",
    "vm.dirty_background_bytes": "/proc/sys/vm/dirty_background_bytes",
    "transparent_hugepage": "/sys/kernel/mm/transparent_hugepage/enabled",
}


class BenchmarkFailed(Exception):
    """A run failed or left a wrong tree: the figures would not be of the same work."""


# -- OCI layouts, streamed -----------------------------------------------------------------------


class _HashingWriter:
    """A file that hashes what is written to it (sha256), so a blob is hashed as it is made."""

    def __init__(self, path: Path) -> None:
        self.file = open(path, "wb")  # noqa: SIM115 (closed by close())
        self.hash = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> int:
        self.hash.update(data)
        self.size += len(data)
        return self.file.write(data)

    def tell(self) -> int:
        return self.size

    def close(self) -> None:
        self.file.close()


class LayoutWriter:
    """An OCI image layout written blob by blob, never holding a large blob in memory."""

    def __init__(self, layout: Path) -> None:
        shutil.rmtree(layout, ignore_errors=True)
        self.layout = layout
        self.blobs = layout / "blobs" / "sha256"
        self.blobs.mkdir(parents=True)

    def bytes_blob(self, media_type: str, content: bytes) -> dict[str, Any]:
        hexdigest = hashlib.sha256(content).hexdigest()
        (self.blobs / hexdigest).write_bytes(content)
        return {"mediaType": media_type, "digest": f"sha256:{hexdigest}", "size": len(content)}

    def file_blob(self, media_type: str, source: Path, sha256: str) -> dict[str, Any]:
        """``source`` as a blob whose sha256 is known: a hard link to it (a copy elsewhere)."""
        target = self.blobs / sha256
        if not target.exists():
            try:
                os.link(source, target)
            except OSError:
                shutil.copyfile(source, target)
        size = target.stat().st_size
        return {"mediaType": media_type, "digest": f"sha256:{sha256}", "size": size}

    def tar_blob(self, media_type: str, members: list[tuple[str, Path]]) -> dict[str, Any]:
        """A tar of ``members`` (name in the tar, file), after an entry for each parent folder
        (as image builders write layers); owners, modes, mtimes fixed; hashed as it is written."""
        partial = self.blobs / ".partial"
        out = _HashingWriter(partial)
        try:
            with tarfile.open(
                fileobj=out, mode="w", format=tarfile.PAX_FORMAT, copybufsize=MiB
            ) as tar:
                folders = sorted({str(Path(name).parent) for name, _ in members} - {"."})
                for folder in folders:
                    tar.addfile(_member(folder + "/", tarfile.DIRTYPE, 0))
                for name, path in members:
                    with open(path, "rb") as stream:
                        tar.addfile(_member(name, tarfile.REGTYPE, path.stat().st_size), stream)
        finally:
            out.close()
        hexdigest = out.hash.hexdigest()
        partial.rename(self.blobs / hexdigest)
        return {"mediaType": media_type, "digest": f"sha256:{hexdigest}", "size": out.size}

    def finish(self, manifest: dict[str, Any]) -> str:
        """Write the manifest and ``index.json`` pointing at it; the manifest's digest."""
        top = self.bytes_blob(OCI_MANIFEST, json.dumps(manifest, indent=2).encode())
        if "artifactType" in manifest:
            top["artifactType"] = manifest["artifactType"]
        index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [top]}
        (self.layout / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
        (self.layout / "index.json").write_text(json.dumps(index, indent=2))
        return top["digest"]


def _member(name: str, kind: bytes, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.size = kind, size
    info.mode = 0o755 if kind == tarfile.DIRTYPE else 0o644
    info.mtime, info.uid, info.gid, info.uname, info.gname = TAR_MTIME, 0, 0, "root", "root"
    return info


def write_artifact(layout: Path, files: dict[str, Path], sha256s: dict[str, str]) -> str:
    """A ModelPack artifact: one raw layer per file (weights, or weight config for the rest)."""
    writer = LayoutWriter(layout)
    layers = []
    for rel, path in files.items():
        kind = MODEL_WEIGHT if rel.endswith(".safetensors") else MODEL_WEIGHT_CONFIG
        layer = writer.file_blob(kind, path, sha256s[rel])
        layers.append(layer | {"annotations": {FILEPATH: rel, TITLE: rel}})
    config = {
        "descriptor": {"name": "bench-model"},
        "config": {"format": "safetensors"},
        "modelfs": {"type": "layers", "diffIds": [layer["digest"] for layer in layers]},
    }
    return writer.finish(
        {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "artifactType": MODEL_ARTIFACT,
            "config": writer.bytes_blob(MODEL_CONFIG, json.dumps(config).encode()),
            "layers": layers,
        }
    )


def write_modelcar(layout: Path, files: dict[str, Path], per_file: bool) -> str:
    """A modelcar: an image whose uncompressed tar layers hold the files under ``models/``."""
    writer = LayoutWriter(layout)
    members = [(f"models/{rel}", path) for rel, path in files.items()]
    groups = [[member] for member in members] if per_file else [members]
    layers = [writer.tar_blob(IMAGE_LAYER, group) for group in groups]
    config = {
        "architecture": "amd64",
        "os": "linux",
        "rootfs": {"type": "layers", "diff_ids": [layer["digest"] for layer in layers]},
    }
    return writer.finish(
        {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": writer.bytes_blob(IMAGE_CONFIG, json.dumps(config).encode()),
            "layers": layers,
        }
    )


def push(registry: Registry, layout: Path, target: str, scratch: Path) -> None:
    """``skopeo copy --preserve-digests`` of ``layout`` to ``target`` (as the test fixture's
    ``push_layout``, but with a limit fit for gigabytes: that one gives skopeo two minutes)."""
    scratch.mkdir(parents=True, exist_ok=True)
    argv = [
        "skopeo",
        "copy",
        "--insecure-policy",
        "--quiet",
        "--preserve-digests",
        "--dest-tls-verify=false",
        f"oci:{layout}",
        f"docker://{registry.ref(target)}",
    ]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **_skopeo_env(scratch)}
    done = subprocess.run(
        argv, env=env, capture_output=True, text=True, timeout=3600, stdin=subprocess.DEVNULL
    )
    if done.returncode:
        raise RuntimeError(f"skopeo copy to {target} failed: {done.stderr.strip()}")


def _skopeo_env(scratch: Path) -> dict[str, str]:
    """skopeo's own settings: no registries.conf, auth file or temporary folder of this machine."""
    (scratch / "tmp").mkdir(parents=True, exist_ok=True)
    conf = scratch / "registries.conf"
    conf.write_text("unqualified-search-registries = []\n")
    return {
        "HOME": str(scratch),
        "TMPDIR": str(scratch / "tmp"),
        "REGISTRY_AUTH_FILE": str(scratch / "auth.json"),
        "CONTAINERS_REGISTRIES_CONF": str(conf),
        "REGISTRIES_CONFIG_PATH": str(conf),
    }


# -- what is pushed, once per fixture ------------------------------------------------------------


@dataclass
class Pushed:
    """One layout in the registry: its reference, the manifest digest, how many layers."""

    layout: str
    target: str  # REPO:TAG
    digest: str
    layers: int


def targets(scale: float, modelcar_layers: str) -> dict[str, str]:
    return {
        "artifact": f"bench/model-artifact:scale-{scale:g}",
        "modelcar": f"bench/model-modelcar:scale-{scale:g}-{modelcar_layers}",
    }


def sha256_of(path: Path) -> str:
    with open(path, "rb") as stream:
        return hashlib.file_digest(stream, "sha256").hexdigest()


def prepare(
    registry: Registry, fixture: Fixture, root: Path, modelcar_layers: str, log=print
) -> tuple[dict[str, Pushed], dict[str, tuple[int, str]]]:
    """Push both layouts unless the registry already holds them for this fixture; what each
    layout is, and every expected file's (size, sha256)."""
    selected = fixture.expected("model")
    files = {rel: fixture.source_path(f"model/{rel}") for rel in sorted(selected)}
    source = {rel: info.md5 for rel, info in selected.items()}
    record_file = root / f"pushed-scale-{fixture.scale:g}.json"
    record: dict[str, Any] = {}
    if record_file.exists():
        record = json.loads(record_file.read_text())
    if record.get("format") != RECORD_FORMAT or record.get("source") != source:
        log(f"hashing the model's {len(files)} files (sha256) ...")
        record = {
            "format": RECORD_FORMAT,
            "source": source,
            "files": {rel: [selected[rel].size, sha256_of(path)] for rel, path in files.items()},
            "pushed": {},
        }
    sha256s = {rel: entry[1] for rel, entry in record["files"].items()}
    pushed: dict[str, Pushed] = {}
    for layout, target in targets(fixture.scale, modelcar_layers).items():
        known = record["pushed"].get(target)
        if known and _holds(registry, target, known["digest"]):
            pushed[layout] = Pushed(**known)
            continue
        folder = root / "layouts" / layout
        started = time.monotonic()
        log(f"writing the {layout} layout and pushing it to {target} ...")
        if layout == "artifact":
            digest = write_artifact(folder, files, sha256s)
            layers = len(files)
        else:
            digest = write_modelcar(folder, files, per_file=modelcar_layers == "per-file")
            layers = len(files) if modelcar_layers == "per-file" else 1
        push(registry, folder, target, root / "skopeo")
        shutil.rmtree(folder)
        if registry.digest(target) != digest:
            raise BenchmarkFailed(f"{target}: the registry holds another manifest than pushed")
        log(f"  pushed in {time.monotonic() - started:.0f} s")
        pushed[layout] = Pushed(layout, target, digest, layers)
        record["pushed"][target] = asdict(pushed[layout])
        record_file.write_text(json.dumps(record, indent=1))
    expected = {rel: (size, sha) for rel, (size, sha) in record["files"].items()}
    return pushed, expected


def _holds(registry: Registry, target: str, digest: str) -> bool:
    try:
        return registry.digest(target) == digest
    except RuntimeError:
        return False


# -- the runs ------------------------------------------------------------------------------------


def verify(dest: Path, expected: dict[str, tuple[int, str]], allowed: frozenset[str]) -> list[str]:
    """Problems with ``dest``: exactly the expected files (``allowed`` extras aside), each of the
    right size and sha256; empty when it is right."""
    found: dict[str, Path] = {}
    for folder, _dirs, names in os.walk(dest):
        for name in names:
            path = Path(folder, name)
            found[path.relative_to(dest).as_posix()] = path
    problems = [f"missing {rel}" for rel in sorted(set(expected) - set(found))]
    problems += [f"unexpected {rel}" for rel in sorted(set(found) - set(expected) - allowed)]
    for rel, (size, sha) in sorted(expected.items()):
        path = found.get(rel)
        if path is None:
            continue
        if path.is_symlink() or not path.is_file():
            problems.append(f"{rel} is not a regular file")
        elif path.stat().st_size != size:
            problems.append(f"{rel}: {path.stat().st_size} bytes, expected {size}")
        elif sha256_of(path) != sha:
            problems.append(f"{rel}: sha256 differs")
    return problems


@dataclass
class Run:
    """One measured run of one contender on one layout."""

    layout: str
    contender: str
    round: int
    pair: str | None
    wall_s: float
    cpu_s: float
    peak_rss_mib: float
    registry_cpu_s: float
    returncode: int
    ok: bool


@dataclass
class Context:
    """What every run needs: the registry, the venv, where runs and logs go."""

    registry: Registry
    pushed: dict[str, Pushed]
    expected: dict[str, tuple[int, str]]
    venv: Path
    runs: Path  # each run's destination: a fresh folder in here
    logs: Path
    scratch: Path  # HOME and TMPDIR of every contender

    def argv(self, name: str, layout: str, dest: Path, work: Path) -> list[str]:
        ref = self.registry.ref(self.pushed[layout].target)
        python = str(self.venv / "python")
        if name == "ours":
            return [
                str(self.venv / "model-initializer"),
                "--storage-uri",
                f"oci://{ref}",
                "--output",
                str(dest),
            ]
        if name == "skopeo":
            return [
                python,
                str(CLIENTS / "skopeo_extract.py"),
                "--ref",
                ref,
                "--dest",
                str(dest),
                "--work",
                str(work),
                "--layout",
                layout,
            ]
        return [python, str(CLIENTS / "oras_pull.py"), "--target", ref, "--dest", str(dest)]

    def env(self, name: str) -> dict[str, str]:
        """A contender's whole environment, built from scratch."""
        home = self.scratch / "home"
        home.mkdir(parents=True, exist_ok=True)
        env = {
            "PATH": f"{self.venv}:/usr/local/bin:/usr/bin:/bin",
            "HOME": str(home),
            "LANG": "C.UTF-8",
            "TMPDIR": str(self.scratch),
        }
        if name == "ours":
            env |= {
                "OCI_INSECURE_REGISTRIES": self.registry.host,
                "TERMINATION_LOG": str(self.scratch / "termination-log"),
                "PROGRESS_INTERVAL": "30",
            }
        elif name == "skopeo":
            env |= _skopeo_env(self.scratch / "skopeo")
        return env


def runs_for(layout: str, only: list[str]) -> list[str]:
    """The contenders of ``layout``: oras-py pulls artifacts, not images."""
    return [name for name in only if not (name == "oras" and layout != "artifact")]


def run_one(ctx: Context, layout: str, name: str, tag: str) -> tuple[measure.Measurement, float]:
    """One run into a fresh folder, checked, then removed: its measurement and the registry's
    CPU seconds meanwhile. BenchmarkFailed when it failed or its tree is wrong."""
    dest, work = ctx.runs / tag, ctx.runs / f"{tag}-work"
    os.sync()  # the previous run's dirty pages are not this run's cost
    registry = psutil.Process(ctx.registry._proc.pid)  # type: ignore[union-attr]
    before = sum(registry.cpu_times()[:2])
    got = measure.run(
        ctx.argv(name, layout, dest, work), ctx.env(name), ctx.logs / f"{tag}.log", timeout_s=3600
    )
    registry_cpu = sum(registry.cpu_times()[:2]) - before
    problems = [] if got.returncode == 0 else [f"exited {got.returncode}"]
    allowed = frozenset(ALLOWED_EXTRA) if name == "ours" else frozenset()
    problems += verify(dest, ctx.expected, allowed)
    if problems:
        shown = "; ".join(problems[:5]) + (f" (+{len(problems) - 5})" if len(problems) > 5 else "")
        raise BenchmarkFailed(f"{tag}: {shown}; see {ctx.logs / (tag + '.log')}")
    for folder in (dest, work):
        shutil.rmtree(folder, ignore_errors=True)
    return got, registry_cpu


def measure_layout(ctx: Context, layout: str, rounds: int, only: list[str], log=print) -> list[Run]:
    """One ours run not measured (so every round follows a fetch), then the paired rounds."""
    names = runs_for(layout, only)
    found: list[Run] = []
    if "ours" in names:
        run_one(ctx, layout, "ours", f"{layout}-warm-up-ours")
        log(f"  {layout:8} ours    warm-up run, not measured")
    for index, slot in enumerate(schedule.paired(names, rounds)):
        tag = f"{layout}-r{slot.round}-{index:02d}-{slot.contender}"
        got, registry_cpu = run_one(ctx, layout, slot.contender, tag)
        run = Run(
            layout,
            slot.contender,
            slot.round,
            slot.pair,
            got.wall_s,
            got.cpu_s,
            got.peak_rss_mib,
            registry_cpu,
            got.returncode,
            True,
        )
        found.append(run)
        log(
            f"  {layout:8} r{slot.round} {slot.contender:7} {got.wall_s:6.2f} s "
            f"cpu {got.cpu_s:5.2f} s  registry cpu {registry_cpu:5.2f} s  "
            f"rss {got.peak_rss_mib:5.0f} MiB"
        )
    return found


# -- the report ----------------------------------------------------------------------------------


def paired(runs: list[Run], layout: str, peer: str) -> ratios.PairedRatio | None:
    """``peer``'s time over ours' in each round of the layout: median and range."""
    records = [{**asdict(r), "run": r.round} for r in runs if r.layout == layout]
    return ratios.summarize(ratios.per_round(records, peer))


def render(results: dict[str, Any]) -> str:
    """The report of a run (or of a saved ``results.json``)."""
    runs = [Run(**r) for r in results["runs"]]
    total = results["fixture"]["bytes"]
    kernel = ", ".join(f"{k} {v}" for k, v in results["kernel_settings"].items())
    versions = ", ".join(f"{k} {v}" for k, v in results["versions"].items())
    pushed = "; ".join(
        f"{p['layout']}: {p['target']} ({p['layers']} layer{'s' if p['layers'] > 1 else ''}, "
        f"{p['digest'][:19]})"
        for p in results["pushed"].values()
    )
    lines = [
        f"OCI registry, scale {results['scale']:g}: the model's {results['fixture']['files']} "
        f"default files, {total / MiB:,.0f} MiB, {results['rounds']} paired rounds. "
        f"Commit {describe_commit(results['commit'])}.",
        "",
        f"Kernel {results['kernel']}, {results['cpus']} CPUs; {kernel} (as found: this benchmark "
        "changes no kernel setting; the page cache is not dropped, runs are `sync`ed before).",
        f"Versions: {versions}.",
        f"Registry: Distribution on 127.0.0.1, plain http, no auth, filesystem storage on the "
        f"destinations' disk, its CPU on the same CPUs as the contenders. Pushed: {pushed}.",
        f"Destinations: {results.get('destinations', 'n/a')}; every tree checked (sizes, sha256).",
        "",
        "| layout | contender | runs | wall s (median) | MiB/s | CPU s (median) "
        "| registry CPU s (median) | peak tree RSS MiB (median, max) "
        "| peer time / ours (median, range) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for layout in LAYOUTS:
        for name in CONTENDERS:
            group = [r for r in runs if r.layout == layout and r.contender == name]
            if not group:
                image = layout != "artifact" and any(r.layout == layout for r in runs)
                if name == "oras" and image:
                    lines.append(
                        f"| {layout} | {LABELS[name]} | - | not run: oras pulls "
                        "artifacts (titled layers), not images | | | | | |"
                    )
                continue
            wall = statistics.median(r.wall_s for r in group)
            rss = [r.peak_rss_mib for r in group]
            figure = paired(runs, layout, name) if name != "ours" else None
            versus = (
                f"{figure.median:.2f}x ({figure.low:.2f}-{figure.high:.2f}, {figure.rounds} rounds)"
                if figure
                else "-"
            )
            lines.append(
                f"| {layout} | {LABELS[name]} | {len(group)} | {wall:.2f} "
                f"| {total / MiB / wall:,.0f} "
                f"| {statistics.median(r.cpu_s for r in group):.2f} "
                f"| {statistics.median(r.registry_cpu_s for r in group):.2f} "
                f"| {statistics.median(rss):.0f} ({max(rss):.0f}) | {versus} |"
            )
    lines += ["", *goals(runs)]
    return "\n".join(lines) + "\n"


def goals(runs: list[Run]) -> list[str]:
    """The issue's goals beside the figures: ours >= 1.5x the fastest peer, RSS <= 200 MiB."""
    out = [
        f"Goals (the issue's): ours >= {GOAL_SPEEDUP}x the fastest peer; ours' peak tree RSS "
        f"<= {GOAL_RSS_MIB} MiB."
    ]
    for layout in LAYOUTS:
        ours = [r.peak_rss_mib for r in runs if r.layout == layout and r.contender == "ours"]
        if not ours:
            continue
        figures = {
            name: figure
            for name in CONTENDERS[1:]
            if (figure := paired(runs, layout, name)) is not None
        }
        if figures:
            fastest = min(figures, key=lambda name: figures[name].median)
            figure = figures[fastest]
            speed = (
                f"fastest peer {LABELS[fastest]}: ours {figure.median:.2f}x "
                f"(range {figure.low:.2f}-{figure.high:.2f}) "
                f"{'met' if figure.median >= GOAL_SPEEDUP else 'NOT met'}"
            )
        else:
            speed = "no peer ran"
        memory = f"RSS max {max(ours):.0f} MiB {'met' if max(ours) <= GOAL_RSS_MIB else 'NOT met'}"
        out.append(f"- {layout}: {speed}; {memory}")
    return out


def kernel_settings() -> dict[str, str]:
    """The kernel settings that moved figures on these VMs, as found (none is changed)."""
    found = {}
    for name, path in KERNEL_SETTINGS.items():
        try:
            found[name] = Path(path).read_text().strip()
        except OSError:
            found[name] = "n/a"
    return found


def versions(venv: Path) -> dict[str, str]:
    return {
        "kf-initializers": _pkg(venv / "python", "kf-initializers"),
        "docker-registry": _first_line([binary() or "docker-registry", "--version"]).split()[-1],
        "skopeo": _first_line(["skopeo", "--version"]).removeprefix("skopeo version "),
        "oras-py": _pkg(venv / "python", "oras"),
        "tar": _first_line(["tar", "--version"]).removeprefix("tar (GNU tar) "),
    }


# -- main ----------------------------------------------------------------------------------------


def write_docs(docs: Path | None, table: str) -> None:
    """The report as ``docs/benchmarks-oci.md`` (which docs/benchmarks.md links to)."""
    if docs is None:
        return
    heading = "# oci:// against skopeo and oras-py (`make bench-oci`)\n\n"
    (docs / "benchmarks-oci.md").write_text(heading + table + "\n")
    print(f"report: {docs / 'benchmarks-oci.md'}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.oci", description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--scale", type=float, default=1.0, help="the fixture's size factor")
    parser.add_argument("--layouts", nargs="+", choices=LAYOUTS, default=list(LAYOUTS))
    parser.add_argument(
        "--only", default=",".join(CONTENDERS), help="contenders, comma-separated: ours,skopeo,oras"
    )
    parser.add_argument(
        "--modelcar-layers",
        choices=("one", "per-file"),
        default="one",
        help="the modelcar's layers: one for all, or one per file",
    )
    parser.add_argument(
        "--bench-dir",
        type=Path,
        default=REPO / ".bench",
        help="fixtures, the registry's storage and results go here",
    )
    parser.add_argument("--report", type=Path, help="render a saved results.json again")
    parser.add_argument("--docs", type=Path, help="write benchmarks-oci.md into this folder")
    args = parser.parse_args(argv)
    if args.report:
        table = render(json.loads(args.report.read_text()))
        print(table)
        write_docs(args.docs, table)
        return 0
    only = [name for name in args.only.split(",") if name]
    if unknown := set(only) - set(CONTENDERS):
        parser.error(f"unknown contenders: {', '.join(sorted(unknown))}")
    missing = [tool for tool in ("skopeo", "tar") if shutil.which(tool) is None]
    missing += [] if binary() else ["docker-registry"]
    if missing:
        raise SystemExit(f"missing: {', '.join(missing)} (apt-get install docker-registry skopeo)")
    started = time.monotonic()
    bench = args.bench_dir.resolve()
    out = bench / "results" / f"oci-{time.strftime('%Y%m%d-%H%M%S')}"
    (out / "logs").mkdir(parents=True)
    venv = Path(sys.executable).parent
    fixture = load_or_generate(bench, args.scale)
    os.sync()  # a freshly generated fixture's writeback must not land in the first runs
    results: dict[str, Any] = {
        "commit": commit(),
        "scale": args.scale,
        "rounds": args.rounds,
        "modelcar_layers": args.modelcar_layers,
        "kernel": os.uname().release,
        "kernel_settings": kernel_settings(),
        "cpus": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "versions": versions(venv),
        "fixture": {
            "files": len(fixture.expected("model")),
            "bytes": fixture.expected_bytes("model"),
        },
        "runs": [],
    }
    failed = None
    with Registry(bench / "oci-registry") as registry:
        pushed, expected = prepare(registry, fixture, bench / "oci-registry", args.modelcar_layers)
        results["pushed"] = {layout: asdict(p) for layout, p in pushed.items()}
        results["destinations"] = destinations.spread(out / "runs")
        ctx = Context(registry, pushed, expected, venv, out / "runs", out / "logs", out / "scratch")
        runs: list[Run] = []
        try:
            for layout in args.layouts:
                print(f"{layout}: {registry.ref(pushed[layout].target)}", flush=True)
                runs += measure_layout(
                    ctx, layout, args.rounds, only, log=lambda line: print(line, flush=True)
                )
        except BenchmarkFailed as exc:
            failed = str(exc)
        results["runs"] = [asdict(r) for r in runs]
    results["elapsed_s"] = round(time.monotonic() - started, 1)
    results["failed"] = failed
    (out / "results.json").write_text(json.dumps(results, indent=1))
    if failed:
        print(f"FAILED: {failed} (its tree is kept under {out / 'runs'})", file=sys.stderr)
        return 1
    shutil.rmtree(out / "runs", ignore_errors=True)
    table = render(results)
    (out / "report.md").write_text(table)
    print(table)
    write_docs(args.docs, table)
    print(f"{results['elapsed_s'] / 60:.1f} minutes; results in {out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

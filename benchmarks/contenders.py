"""The contenders: how each one is asked to fetch an asset into a destination folder.

Every contender runs as its own process (tree) with a clean environment and the same
credentials, against the same endpoints. For the model, everyone fetches the same files: ours
with its default patterns, the others with the equivalent excludes (``fixtures.MODEL_EXCLUDES``)
or, for ``snapshot_download``, the same allow/ignore globs.

``rerun`` is the command for a second run into a destination that already holds (part of) the
asset: the same command, except for tools whose own answer to that is a different mode
(``s5cmd sync``, ``aws s3 sync``).
"""

from __future__ import annotations

import compileall
import dataclasses
import re
import shlex
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.fixtures import BUCKET, MODEL_ALLOW, MODEL_EXCLUDES, MODEL_IGNORE, Fixture

CLIENTS = Path(__file__).resolve().parent / "clients"
REPO_ROOT = Path(__file__).resolve().parent.parent
HUB_REPOS = {"model": ("bench/model", "model"), "dataset": ("bench/dataset", "dataset")}


@dataclass(frozen=True)
class Task:
    """What to fetch: from which endpoint ("s3", "hf", or the emulators' "gcs" and "az"), which
    asset, first run or a rerun, whether from the delayed endpoints (the latency scenarios),
    whether every byte must be on stable storage before the exit (the durable scenarios),
    whether from the S3 port with nginx's own ETags and no checksums (source ``s3nginx``) or the
    one over HTTPS (source ``s3tls``), and for ours the shared asset store to use (``CACHE_DIR``;
    the second-trainjob scenarios)."""

    source: str
    asset: str
    rerun: bool = False
    delayed: bool = False
    durable: bool = False
    nginx_etags: bool = False
    tls: bool = False
    cache: Path | None = None


@dataclass
class Context:
    """Where everything is: fixture, endpoints, venvs, a scratch folder for this run; the
    emulators' addresses once they are up (:mod:`benchmarks.cloudemulators`)."""

    fixture: Fixture
    s3_url: str
    hub_url: str
    venv: Path
    kserve_venv: Path
    scratch: Path
    ours_src: Path | None = None  # a frozen copy of the package, so one session measures one code
    gcs_url: str = ""  # fake-gcs-server, as STORAGE_EMULATOR_HOST
    az_connection_string: str = ""  # Azurite, as AZURE_STORAGE_CONNECTION_STRING
    ca_bundle: str = ""  # the CA of the HTTPS port, for the scenarios that use it

    def cloud_env(self, source: str) -> dict[str, str]:
        """What points a client at the gs:// or az:// emulator: the variables both SDKs and ours
        read (Google's emulator convention; Azure's connection string, naming the endpoint)."""
        if source == "gcs":
            return {"STORAGE_EMULATOR_HOST": self.gcs_url}
        if source == "az":
            return {"AZURE_STORAGE_CONNECTION_STRING": self.az_connection_string}
        return {}

    def base_env(self) -> dict[str, str]:
        home = self.scratch / "home"
        home.mkdir(parents=True, exist_ok=True)
        return {
            "PATH": f"{self.venv / 'bin'}:/usr/local/bin:/usr/bin:/bin",
            "HOME": str(home),
            "LANG": "C.UTF-8",
            "TMPDIR": str(self.scratch),
            "AWS_ACCESS_KEY_ID": "bench-access-key",
            "AWS_SECRET_ACCESS_KEY": "bench-secret-key",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
            "HF_ENDPOINT": self.hub_url,
            "HF_HOME": str(self.scratch / "hf-home"),
            "HF_HUB_DISABLE_XET": "1",
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        } | self.trust_env()

    def trust_env(self) -> dict[str, str]:
        """What makes every client trust the HTTPS port's CA: the AWS tools' and ours' variable,
        requests', curl's, and OpenSSL's and Go's (s5cmd) file of roots."""
        names = ("AWS_CA_BUNDLE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "SSL_CERT_FILE")
        return dict.fromkeys(names, self.ca_bundle) if self.ca_bundle else {}


@dataclass
class Invocation:
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)


def _excludes(asset: str) -> tuple[str, ...]:
    return MODEL_EXCLUDES if asset == "model" else ()


class Contender:
    """One tool. ``command`` returns None for tasks it cannot do (e.g. S3 tools on the Hub)."""

    name = ""
    label = ""
    sources: tuple[str, ...] = ("s3",)
    assets: tuple[str, ...] = ("model", "dataset")  # "files" (100,000 objects): ours and s5cmd
    reference = False  # not an S3/Hub client: a yardstick (disk copy, raw GETs)
    skips_complete = False  # a rerun into a complete destination fetches nothing
    resumes_partial = False  # a rerun after a kill continues half-written files
    durable = False  # plays the durable scenarios (all bytes synced before the exit), only those
    optional = False  # runs only when named (--only): the write-size variants

    def command(self, ctx: Context, task: Task, dest: Path) -> Invocation | None:
        raise NotImplementedError

    def applies(self, task: Task) -> bool:
        return (
            task.source in self.sources
            and task.asset in self.assets
            and task.durable == self.durable
        )


class Ours(Contender):
    name, label = "ours", "kf-initializers (this project)"
    sources = ("s3", "hf", "gcs", "az")
    assets = ("model", "dataset", "files")
    skips_complete = resumes_partial = True

    def command(self, ctx: Context, task: Task, dest: Path) -> Invocation:
        program = (
            ctx.venv / "bin" / f"{'model' if task.asset == 'model' else 'dataset'}-initializer"
        )
        if task.source == "s3":
            uri, extra = f"s3://{BUCKET}/{task.asset}", ["--endpoint", ctx.s3_url]
        elif task.source in ("gcs", "az"):
            scheme = "gs" if task.source == "gcs" else "az"
            uri, extra = f"{scheme}://{BUCKET}/{task.asset}", []
        else:
            repo, kind = HUB_REPOS[task.asset]
            uri, extra = (f"hf://datasets/{repo}" if kind == "dataset" else f"hf://{repo}"), []
        env = {
            **({"PYTHONPATH": str(ctx.ours_src)} if ctx.ours_src else {}),
            "ACCESS_KEY_ID": "bench-access-key",
            "SECRET_ACCESS_KEY": "bench-secret-key",
            "TERMINATION_LOG": str(ctx.scratch / "termination-log"),
            **ctx.cloud_env(task.source),
            **({"CACHE_DIR": str(task.cache)} if task.cache else {}),
        }
        argv = [str(program), "--storage-uri", uri, "--output", str(dest), *extra]
        return Invocation(argv, env)

    def sharded(
        self, ctx: Context, task: Task, dest: Path, endpoints: list[str], run: str, logs: Path
    ) -> Invocation:
        """K processes of ours started together into one ``dest``, as K pods of an Indexed Job:
        shard i has ``SHARDS=K``, ``JOB_COMPLETION_INDEX=i``, its own ``ENDPOINT``
        (``endpoints[i]``) and the run's ``SHARD_RUN``; its output goes to ``logs/shard-i.log``.
        The wrapper exits when the last of them has, with the first failing shard's code (and
        the tail of every shard's log when one failed)."""
        if task.source != "s3":
            raise ValueError("the sharded runs fetch from S3 endpoints")
        base = self.command(ctx, task, dest)
        argv = base.argv[: base.argv.index("--endpoint")]  # each shard's ENDPOINT says where
        logs.mkdir(parents=True, exist_ok=True)
        count = len(endpoints)
        lines = ['pids=""']
        for index, endpoint in enumerate(endpoints):
            env = {
                "SHARDS": str(count),
                "JOB_COMPLETION_INDEX": str(index),
                "ENDPOINT": endpoint,
                "SHARD_RUN": run,
                "TERMINATION_LOG": str(ctx.scratch / f"termination-log-{index}"),
            }
            assignments = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
            log = shlex.quote(str(logs / f"shard-{index}.log"))
            lines.append(f'{assignments} {shlex.join(argv)} >{log} 2>&1 & pids="$pids $!"')
        lines += [
            "rc=0",
            'for p in $pids; do wait "$p"; c=$?; if [ "$rc" = 0 ]; then rc=$c; fi; done',
            f'if [ "$rc" != 0 ]; then tail -n 12 {shlex.quote(str(logs))}/shard-*.log; fi',
            'exit "$rc"',
        ]
        return Invocation(["/bin/bash", "-c", "\n".join(lines)], base.env)


class OursDurable(Ours):
    """Ours with ``--durable``: every file and folder on stable storage before exit 0."""

    name, label = "ours-durable", "kf-initializers --durable (this project)"
    sources, assets = ("s3",), ("model",)
    durable = True

    def command(self, ctx: Context, task: Task, dest: Path) -> Invocation:
        base = super().command(ctx, task, dest)
        return Invocation([*base.argv, "--durable"], base.env)


class OursWriteSize(Ours):
    """Ours with another :data:`initializers.fsutil.WRITE_SIZE` (a copy of the measured code
    with that one constant changed), for the write-size sweep: ``--only ours,ours-w64k,...``."""

    optional = True

    def __init__(self, kib: int) -> None:
        self.kib = kib
        self.name = f"ours-w{kib}k"
        self.label = f"kf-initializers, writes of {kib} KiB"

    def command(self, ctx: Context, task: Task, dest: Path) -> Invocation:
        assert ctx.ours_src is not None, "the variants are copies of the measured code"
        variant = ctx.ours_src.parent / f"src-w{self.kib}k"
        if not variant.exists():
            shutil.copytree(ctx.ours_src, variant)
            fsutil = variant / "initializers" / "fsutil.py"
            text, count = re.subn(
                r"^WRITE_SIZE = .*$",
                f"WRITE_SIZE = {self.kib << 10}",
                fsutil.read_text(),
                count=1,
                flags=re.MULTILINE,
            )
            if count != 1:
                raise RuntimeError(f"{fsutil}: no WRITE_SIZE line to change")
            fsutil.write_text(text)
            compileall.compile_dir(variant, quiet=1)
        return super().command(dataclasses.replace(ctx, ours_src=variant), task, dest)


class S5cmd(Contender):
    name, label = "s5cmd", "s5cmd"
    assets = ("model", "dataset", "files")
    skips_complete = True  # with `sync` on reruns

    def command(self, ctx: Context, task: Task, dest: Path) -> Invocation:
        verb = "sync" if task.rerun else "cp"
        excludes = [a for p in _excludes(task.asset) for a in ("--exclude", p)]
        argv = [
            str(ctx.venv / "bin" / "s5cmd"), "--endpoint-url", ctx.s3_url, verb, *excludes,
            f"s3://{BUCKET}/{task.asset}/*", f"{dest}/",
        ]  # fmt: skip
        return Invocation(argv)


class AwsCli(Contender):
    name, label = "aws-cli", "aws s3 cp --recursive"
    skips_complete = True  # with `aws s3 sync` on reruns

    def command(self, ctx: Context, task: Task, dest: Path) -> Invocation:
        verb = ["sync"] if task.rerun else ["cp", "--recursive"]
        excludes = [a for p in _excludes(task.asset) for a in ("--exclude", p)]
        argv = [
            str(ctx.venv / "bin" / "aws"), "s3", *verb, f"s3://{BUCKET}/{task.asset}/", str(dest),
            "--endpoint-url", ctx.s3_url, "--only-show-errors", *excludes,
        ]  # fmt: skip
        return Invocation(argv, {"AWS_CONFIG_FILE": "/dev/null"})


class ClientScript(Contender):
    """A driver script of ``clients/`` that copies a prefix (they share one argument set)."""

    script = ""

    def where(self, ctx: Context, task: Task) -> tuple[list[str], dict[str, str]]:
        """The arguments and environment that point the script at its server."""
        return [], {}

    def command(self, ctx: Context, task: Task, dest: Path) -> Invocation:
        excludes = [a for p in _excludes(task.asset) for a in ("--exclude", p)]
        args, env = self.where(ctx, task)
        argv = [
            str(ctx.venv / "bin" / "python"), str(CLIENTS / self.script), *args,
            "--bucket", BUCKET, "--prefix", task.asset, "--dest", str(dest), *excludes,
        ]  # fmt: skip
        return Invocation(argv, env)


class S3ClientScript(ClientScript):
    """An S3 driver script: the endpoint is an argument."""

    def where(self, ctx: Context, task: Task) -> tuple[list[str], dict[str, str]]:
        return ["--endpoint", ctx.s3_url], {}


class Boto3(S3ClientScript):
    name, label, script = "boto3", "boto3 TransferManager", "boto3_tm.py"


class KubeflowS3(S3ClientScript):
    name, label, script = "kubeflow-s3", "Kubeflow S3 initializer (OpenDAL)", "kubeflow_opendal.py"


class CloudSdkScript(ClientScript):
    """A gs:// or az:// driver script using the cloud's SDK: the emulator is in the environment."""

    def where(self, ctx: Context, task: Task) -> tuple[list[str], dict[str, str]]:
        return [], ctx.cloud_env(task.source)


class GcsTransferManager(CloudSdkScript):
    name, label, script = "gcs-tm", "google-cloud-storage transfer manager", "gcs_tm.py"
    sources = ("gcs",)


class AzureBlobSdk(CloudSdkScript):
    name, label, script = "azure-blob", "azure-storage-blob download_blob", "azure_blob.py"
    sources = ("az",)


class KServe(Contender):
    name, label = "kserve", "KServe storage initializer"
    sources = ("s3", "hf")

    def applies(self, task: Task) -> bool:
        # kserve-storage's hf:// takes owner/model only: no dataset repos.
        return super().applies(task) and not (task.source == "hf" and task.asset == "dataset")

    def command(self, ctx: Context, task: Task, dest: Path) -> Invocation:
        uri = f"s3://{BUCKET}/{task.asset}" if task.source == "s3" else "hf://bench/model"
        env = {
            "AWS_ENDPOINT_URL": ctx.s3_url,
            "S3_VERIFY_SSL": "1" if task.tls else "0",
            "PATH": f"{ctx.kserve_venv / 'bin'}:/usr/bin:/bin",
        }
        if task.asset == "model":
            env["STORAGE_IGNORE_PATTERNS"] = ",".join(MODEL_EXCLUDES)
        argv = [str(ctx.kserve_venv / "bin" / "python"), str(CLIENTS / "kserve_init.py"), uri]
        return Invocation([*argv, str(dest)], env)


def _hub_script(ctx: Context, script: str, task: Task, dest: Path) -> list[str]:
    """argv of a Hub client script in clients/: the repo, and for the model the same globs."""
    repo, kind = HUB_REPOS[task.asset]
    argv = [
        str(ctx.venv / "bin" / "python"), str(CLIENTS / script),
        "--repo", repo, "--repo-type", kind, "--dest", str(dest),
    ]  # fmt: skip
    if task.asset == "model":
        argv += [a for p in MODEL_ALLOW for a in ("--allow", p)]
        argv += [a for p in MODEL_IGNORE for a in ("--ignore", p)]
    return argv


class HfSnapshot(Contender):
    name, label = "hf-snapshot", "huggingface_hub snapshot_download"
    sources = ("hf",)
    skips_complete = True  # 2.x downloads into a per-process temp file: partial files restart

    def command(self, ctx: Context, task: Task, dest: Path) -> Invocation:
        return Invocation(_hub_script(ctx, "hf_snapshot.py", task, dest))


class HfObstore(Contender):
    """The naive script a user would write: ``HfApi`` lists, obstore fetches every ``resolve``."""

    name, label = "hf-obstore", "HfApi listing + obstore (naive script)"
    sources = ("hf",)

    def applies(self, task: Task) -> bool:
        return super().applies(task) and not task.rerun

    def command(self, ctx: Context, task: Task, dest: Path) -> Invocation:
        return Invocation(_hub_script(ctx, "hf_obstore.py", task, dest))


class Curl8(Contender):
    """Reference: eight curl processes, each GETting its share of the files (balanced by size)."""

    name, label = "curl-8", "8 \u00d7 curl, raw GETs (reference)"
    sources = ("s3", "hf")
    reference = True

    def applies(self, task: Task) -> bool:
        return super().applies(task) and not task.rerun

    def command(self, ctx: Context, task: Task, dest: Path) -> Invocation:
        files = sorted(ctx.fixture.expected(task.asset).items(), key=lambda kv: -kv[1].size)
        shares: list[list[str]] = [[] for _ in range(8)]
        loads = [0] * 8
        for rel, obj in files:
            i = loads.index(min(loads))
            loads[i] += obj.size
            if task.source == "s3":
                url = f"{ctx.s3_url}/{BUCKET}/{task.asset}/{rel}"
            else:
                repo, kind = HUB_REPOS[task.asset]
                base = (
                    f"{ctx.hub_url}/datasets/{repo}"
                    if kind == "dataset"
                    else f"{ctx.hub_url}/{repo}"
                )
                url = f"{base}/resolve/main/{rel}"
            shares[i] += [f'url = "{url}"', f'output = "{dest / rel}"']
        script = []
        for i, lines in enumerate(shares):
            if not lines:
                continue
            config = ctx.scratch / f"curl-{i}.cfg"
            config.write_text(
                "\n".join(
                    ["--fail", "--silent", "--show-error", "--create-dirs", "--location", *lines]
                )
                + "\n"
            )
            script.append(f'curl -K {config} & pids="$pids $!"')
        script.append("for p in $pids; do wait $p || exit 1; done")
        return Invocation(["/bin/bash", "-c", "\n".join(script)])


def _fixture_files(ctx: Context, task: Task, name: str) -> tuple[Path, Path]:
    """The asset's folder in the fixture, and a file (``name``, in the scratch folder) that
    lists every file the asset is expected to hold, one relative path a line."""
    listing = ctx.scratch / name
    listing.write_text("\n".join(sorted(ctx.fixture.expected(task.asset))) + "\n")
    return ctx.fixture.source_path(task.asset), listing


class DiskCopy(Contender):
    """Reference: ``cp`` of the same files from the fixture folder (page cache to disk).

    Not in the latency scenarios: it makes no request, so it has nothing to wait for.
    """

    name, label = "disk-copy", "cp from local disk (reference)"
    sources = ("s3", "hf")
    reference = True

    def applies(self, task: Task) -> bool:
        return super().applies(task) and not task.rerun and not task.delayed

    def command(self, ctx: Context, task: Task, dest: Path) -> Invocation:
        source, listing = _fixture_files(ctx, task, "copy-list.txt")
        script = (
            f"mkdir -p {dest} && cd {source} && xargs -d '\\n' -a {listing} cp --parents -t {dest}"
        )
        return Invocation(["/bin/bash", "-c", script])


class DiskFloor(Contender):
    """Reference for the durable scenarios: each file copied from the fixture folder (page
    cache) by ``dd bs=1M conv=fdatasync``, one after the other: what the disk takes to hold
    these bytes on stable storage, whoever writes them. 1 MiB blocks, the fastest here: after a
    large free (the previous run's tree), 4 MiB ones took 9.4 s for the model, 8.3 CPU-seconds
    of it copying into the page cache (memory the VM had handed back to the host), 1 MiB and
    256 KiB ones 2.7-2.8 s (by hand, two runs of each)."""

    name, label = "disk-floor", "dd conv=fdatasync of the same files (disk floor)"
    sources, assets = ("s3",), ("model",)
    reference = durable = True

    def command(self, ctx: Context, task: Task, dest: Path) -> Invocation:
        source, listing = _fixture_files(ctx, task, "floor-list.txt")
        script = (
            f"cd {shlex.quote(str(source))} && while IFS= read -r f; do "
            f'mkdir -p "{dest}/$(dirname "$f")" && '
            f'dd if="$f" of="{dest}/$f" bs=1M conv=fdatasync status=none || exit 1; '
            f"done < {shlex.quote(str(listing))}"
        )
        return Invocation(["/bin/bash", "-c", script])


WRITE_SIZES_KIB = (32, 64, 128, 256, 1024)

ALL: tuple[Contender, ...] = (
    Ours(),
    OursDurable(),
    S5cmd(),
    AwsCli(),
    Boto3(),
    KubeflowS3(),
    KServe(),
    GcsTransferManager(),
    AzureBlobSdk(),
    HfSnapshot(),
    HfObstore(),
    Curl8(),
    DiskCopy(),
    DiskFloor(),
    *(OursWriteSize(kib) for kib in WRITE_SIZES_KIB),
)


def by_names(names: str | None) -> list[Contender]:
    if not names:
        return [c for c in ALL if not c.optional]
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    known = {c.name: c for c in ALL}
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise ValueError(f"unknown contender(s) {unknown}; choose from {', '.join(known)}")
    return [known[n] for n in wanted]


def environment(ctx: Context, invocation: Invocation) -> dict[str, str]:
    """A contender's whole environment: built from scratch, nothing of the harness's leaks in."""
    return ctx.base_env() | invocation.env

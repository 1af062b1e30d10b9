"""The runtimes' initializer containers, run with podman from the real images (``make e2e``).

Each container spec (args, env after the controller's merge, securityContext, volumes) becomes a
``podman run`` with the settings a kubelet applies: ``runAsUser`` → ``--user``, ``fsGroup`` →
``--group-add`` and a volume owned by that group (setgid, 2775), ``readOnlyRootFilesystem`` →
``--read-only`` with no tmpfs of podman's own, ``allowPrivilegeEscalation: false`` →
``no-new-privileges``, dropped capabilities → ``--cap-drop``; emptyDirs are 0777 host folders.
This proves the securityContext the runtimes declare works with the images as built. A claim
(``persistentVolumeClaim``) is a host folder the test hands in, shared by the pods that mount it,
and a ``readOnly`` mount is mounted ``:ro``. The pods of a sharded Job are the controller
model's (:func:`tests.runtimes.controller.initializer_pods`), each with its index and run.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
import time
import tomllib
from pathlib import Path, PurePosixPath
from urllib.parse import parse_qs, urlsplit

import boto3
import pytest

from initializers.errors import ExitCode
from initializers.shards import partition
from initializers.sources.base import RemoteFile
from tests.podman import podman, podman_env
from tests.runtimes import controller, manifests, render
from tests.servers.hub import HubServer, RequestRecord

pytestmark = pytest.mark.images

LOCAL_PREFIX = "localhost/kf-initializers/"
OUR_PREFIX = "ghcr.io/kubeflow-initializers/"
TRAINER_UID = 1000  # the trainer images' user, in the runtimes' fsGroup
WAITING = "waiting for another initializer fetching"


def _podman(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return podman(*args, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def local_images() -> dict[str, str]:
    """Build (or reuse from podman's cache) the initializer images; public name → local name."""
    if shutil.which("podman") is None:
        pytest.skip("podman is not installed: run `bash .ci/images.sh` first")
    build = subprocess.run(
        ["bash", "images/build.sh"], cwd=manifests.REPO_ROOT, capture_output=True, text=True,
        timeout=900, stdin=subprocess.DEVNULL, check=False,
    )  # fmt: skip
    assert build.returncode == 0, build.stderr[-3000:]
    with (manifests.REPO_ROOT / "pyproject.toml").open("rb") as stream:
        version = tomllib.load(stream)["project"]["version"]
    built = set(build.stdout.split())
    names = {}
    for step in manifests.INITIALIZER_STEPS:
        local = f"{LOCAL_PREFIX}{step}:{version}"
        assert local in built, f"images/build.sh did not print {local}"
        names[f"{OUR_PREFIX}{step}"] = local
    return names


def podman_argv(container: dict, pod: dict, env: dict[str, str], volumes: dict[str, Path],
                image: str, name: str) -> list[str]:  # fmt: skip
    """``podman run`` for one Kubernetes container, as a kubelet would start it."""
    pod_context = pod.get("securityContext") or {}
    context = {**pod_context, **(container.get("securityContext") or {})}
    argv = ["run", "--rm", "--name", name, "--network", "host", "--init=false"]
    user = str(context["runAsUser"])
    if "runAsGroup" in context:
        user += f":{context['runAsGroup']}"
    argv += ["--user", user]
    if "fsGroup" in pod_context:
        argv += ["--group-add", str(pod_context["fsGroup"])]
    if context.get("readOnlyRootFilesystem"):
        argv += ["--read-only", "--read-only-tmpfs=false"]
    if context.get("allowPrivilegeEscalation") is False:
        argv += ["--security-opt", "no-new-privileges"]
    for capability in (context.get("capabilities") or {}).get("drop", []):
        argv += ["--cap-drop", capability]
    for mount in container.get("volumeMounts", []):
        read_only = ":ro" if mount.get("readOnly") else ""
        argv += ["-v", f"{volumes[mount['name']]}:{mount['mountPath']}{read_only}"]
    for key, value in env.items():
        argv += ["-e", f"{key}={value}"]
    if container.get("command"):
        argv += ["--entrypoint", container["command"][0]]
    argv.append(image)
    argv += container.get("command", [])[1:] + container.get("args", [])
    return argv


def fs_group_volume(path: Path, group: int) -> Path:
    """A fresh volume as kubelet leaves it for an fsGroup pod: group-owned, setgid, 2775."""
    path.mkdir(parents=True)
    os.chown(path, 0, group)
    path.chmod(0o2775)
    return path


def pod_volumes(pod: dict, scratch: Path, shared: dict[str, Path]) -> dict[str, Path]:
    """Volume name → host folder: ``shared`` (the TrainJob's ``initializer`` volume, the claims
    the test hands in) and a fresh 0777 folder under ``scratch`` for each emptyDir."""
    volumes = dict(shared)
    for volume in pod.get("volumes", []):
        if "persistentVolumeClaim" in volume:
            assert volume["name"] in shared, f"the test hands in no folder for {volume}"
            continue
        assert "emptyDir" in volume, f"only emptyDir and claim volumes are modelled: {volume}"
        volumes[volume["name"]] = scratch / volume["name"]
        volumes[volume["name"]].mkdir(parents=True)
        volumes[volume["name"]].chmod(0o777)
    return volumes


def initializer_argv(runtime: dict, step: str, train_job: dict, secrets: dict, root: Path,
                     images: dict[str, str], claims: dict[str, Path] | None = None,
                     name: str = "") -> list[str]:  # fmt: skip
    """``podman run`` for the ``step`` initializer pod of ``train_job``, whose TrainJob volume
    is ``root/pvc``; ``claims`` maps the claim volumes it mounts to host folders."""
    container = controller.initializer_container(runtime, step, train_job)
    env = controller.resolve_env(container, secrets)
    pod = manifests.pod_spec(manifests.step_job(runtime, step))
    volumes = pod_volumes(pod, root / step, {"initializer": root / "pvc", **(claims or {})})
    image = images[render.split_image(container["image"])[0]]
    return podman_argv(container, pod, env, volumes, image, name or f"kf-rt-{step}-{os.getpid()}")


def run_pod(runtime: dict, step: str, train_job: dict, secrets: dict, root: Path,
            images: dict[str, str]) -> subprocess.CompletedProcess:  # fmt: skip
    argv = initializer_argv(runtime, step, train_job, secrets, root, images)
    return _podman(*argv, timeout=300)


@pytest.mark.parametrize("runtime_name", ["torch-distributed", "torchtune-qwen2.5-1.5b"])
def test_initializers_fetch_under_the_declared_security_context_and_trainers_can_read(
    runtime_name: str, tmp_path: Path, local_images: dict[str, str], s3_endpoint: str
):
    runtime = next(
        doc for doc in render.render_subset(manifests.RUNTIMES_DIR)
        if doc["metadata"]["name"] == runtime_name
    )  # fmt: skip
    s3 = boto3.client(
        "s3",
        endpoint_url=s3_endpoint,
        region_name="us-east-1",
        aws_access_key_id="AKIAPODMAN",
        aws_secret_access_key="podman-secret",
    )
    bucket = f"podman-pods-{os.getpid()}-{runtime_name.replace('.', '-')}"
    s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=bucket, Key="model/config.json", Body=b"{}")
    s3.put_object(Bucket=bucket, Key="model/model.safetensors", Body=os.urandom(100_000))
    s3.put_object(Bucket=bucket, Key="data/train.parquet", Body=os.urandom(50_000))
    creds = {"ACCESS_KEY_ID": "AKIAPODMAN", "SECRET_ACCESS_KEY": "podman-secret"}
    endpoint = [{"name": "ENDPOINT", "value": s3_endpoint}]
    secret = {"name": "s3"}
    train_job = {"spec": {"initializer": {
        "dataset": {"storageUri": f"s3://{bucket}/data", "env": endpoint, "secretRef": secret},
        "model": {"storageUri": f"s3://{bucket}/model", "env": endpoint, "secretRef": secret},
    }}}  # fmt: skip
    fs_group = manifests.pod_spec(manifests.step_job(runtime, "model-initializer"))[
        "securityContext"
    ]["fsGroup"]
    fs_group_volume(tmp_path / "pvc", fs_group)

    for step in manifests.INITIALIZER_STEPS:
        result = run_pod(runtime, step, train_job, {"s3": creds}, tmp_path, local_images)
        assert result.returncode == 0, f"{step}: {result.stdout}{result.stderr}"

    model, dataset = tmp_path / "pvc" / "model", tmp_path / "pvc" / "dataset"
    assert (model / "model.safetensors").stat().st_size == 100_000
    assert (dataset / "train.parquet").stat().st_size == 50_000
    # What the initializers wrote belongs to the fsGroup, so a trainer (UID 1000 in that group)
    # reads it and can write its output next to it.
    for path in [model, dataset, *model.iterdir(), *dataset.iterdir()]:
        assert path.stat().st_gid == fs_group, f"{path} is not in group {fs_group}"
    trainer = (
        "run", "--rm", "--network", "none", "--user", f"{TRAINER_UID}:{TRAINER_UID}",
        "--group-add", str(fs_group), "-v", f"{tmp_path / 'pvc'}:/workspace",
        local_images[f"{OUR_PREFIX}model-initializer"], "sh", "-c",
        "cat /workspace/model/model.safetensors >/dev/null && mkdir /workspace/output",
    )  # fmt: skip
    check = _podman(*trainer, timeout=120)
    assert check.returncode == 0, check.stderr


def test_initializer_with_no_storage_uri_completes_on_a_read_only_root(
    tmp_path: Path, local_images: dict[str, str]
):
    runtime = next(
        doc for doc in render.render_subset(manifests.RUNTIMES_DIR)
        if doc["metadata"]["name"] == "torch-distributed"
    )  # fmt: skip
    fs_group_volume(tmp_path / "pvc", 1000)
    for step in manifests.INITIALIZER_STEPS:
        result = run_pod(runtime, step, {"spec": {}}, {}, tmp_path, local_images)
        assert result.returncode == 0, result.stderr
        assert "no storageUri given, nothing to fetch" in result.stdout
    assert not any((tmp_path / "pvc").iterdir())


def test_a_wrong_token_fails_the_initializer_job_after_its_first_pod(
    tmp_path: Path, local_images: dict[str, str], hub: HubServer
):
    """The real image, a Secret with a token the Hub refuses: exit 3 with the fix named, the
    token in no output, and the runtime's podFailurePolicy fails the Job on that pod instead of
    starting six more to meet the same refusal."""
    runtime = next(
        doc for doc in render.render_subset(manifests.RUNTIMES_DIR)
        if doc["metadata"]["name"] == "torch-distributed"
    )  # fmt: skip
    hub.tokens = {"hf_good"}
    hub.add_repo("org/private-model", {"config.json": b"{}"}, private=True)
    step = "model-initializer"
    train_job = {"spec": {"initializer": {"model": {
        "storageUri": "hf://org/private-model",
        "env": [{"name": "HF_ENDPOINT", "value": hub.endpoint}],
        "secretRef": {"name": "hf"},
    }}}}  # fmt: skip
    fs_group_volume(tmp_path / "pvc", 1000)
    wrong = "hf_revoked0123456789"
    result = run_pod(runtime, step, train_job, {"hf": {"HF_TOKEN": wrong}}, tmp_path, local_images)
    assert result.returncode == ExitCode.AUTH, result.stdout + result.stderr
    assert "token" in result.stderr.lower() and "Traceback" not in result.stderr
    assert wrong not in result.stdout + result.stderr
    job = controller.initializer_job(runtime, step, train_job)
    assert controller.pod_failure_action(job, {step: result.returncode}) == "FailJob"


def _served(hub: HubServer, name: str) -> list[RequestRecord]:
    """GETs that sent the file ``name``'s bytes: from the Hub's resolve URL or, for an LFS file
    it redirected, from the CDN (which names the file in its signed URL's query)."""
    found = []
    for record in hub.requests:
        url = urlsplit(record.path)
        named = url.path.endswith(f"/{name}") or parse_qs(url.query).get("name") == [name]
        if record.method == "GET" and record.status in (200, 206) and named:
            found.append(record)
    return found


def test_two_trainjobs_sharing_one_cache_claim_fetch_each_file_once_and_link_one_entry(
    tmp_path: Path, local_images: dict[str, str], hub: HubServer
):
    """Two TrainJobs of one namespace on torch-distributed with the asset-cache component: their
    model initializer pods (a workspace volume each, one cache claim at /cache) start together;
    the one that arrives second waits while the first fetches, the Hub sends each file once, and
    both workspaces link one entry. A trainer pod mounting its workspace and the cache as the
    runtime declares passes kf-torchrun's asset check and cannot write into the entry; without
    the cache mounted it is told to mount it. The prune CronJob then runs on the claim."""
    runtime = next(
        doc for doc in render.with_component(manifests.ASSET_CACHE_DIR)
        if doc["metadata"]["name"] == "torch-distributed"
    )  # fmt: skip
    files = {
        "config.json": b'{"hidden_size": 16}',
        "tokenizer.json": b'{"model": {"type": "BPE"}}',
        "model.safetensors": os.urandom(2 << 20),
    }
    hub.add_repo("org/shared-model", files)
    released = threading.Event()

    def park_file_bytes(record: RequestRecord) -> None:  # listings and HEADs go through
        if record.method == "GET" and not record.path.startswith("/api/"):
            released.wait(45)  # below the initializers' 60 s stall timeout: never retried

    hub.fault = park_file_bytes
    fs_group = manifests.pod_spec(manifests.step_job(runtime, "model-initializer"))[
        "securityContext"
    ]["fsGroup"]
    cache = fs_group_volume(tmp_path / "cache", fs_group)
    claims = {manifests.CACHE_VOLUME: cache}
    train_job = {"metadata": {"name": "sweep"}, "spec": {
        "initializer": {"model": {
            "storageUri": "hf://org/shared-model",
            "env": [{"name": "HF_ENDPOINT", "value": hub.endpoint}],
        }},
        "trainer": {"args": ["train.py"], "env": [
            {"name": "KF_REQUIRE_ASSETS", "value": "/workspace/model"},
            {"name": "KF_WAIT_TIMEOUT", "value": "0"},
        ]},
    }}  # fmt: skip
    jobs = [tmp_path / f"trainjob-{n}" for n in (1, 2)]
    running = []
    for n, job in enumerate(jobs, 1):
        fs_group_volume(job / "pvc", fs_group)
        argv = initializer_argv(
            runtime, "model-initializer", train_job, {}, job, local_images, claims,
            name=f"kf-rt-cache-{n}-{os.getpid()}",
        )  # fmt: skip
        with (job / "log").open("wb") as log:
            process = subprocess.Popen(
                ["podman", *argv], env=podman_env(), stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        running.append(process)
    try:
        deadline = time.monotonic() + 40
        while not any(WAITING in (job / "log").read_text() for job in jobs):
            alive = all(process.poll() is None for process in running)
            assert alive and time.monotonic() < deadline, [(j / "log").read_text() for j in jobs]
            time.sleep(0.1)
    finally:
        released.set()
    codes = [process.wait(timeout=300) for process in running]
    logs = [(job / "log").read_text() for job in jobs]
    assert codes == [0, 0], logs

    for name in files:
        assert len(_served(hub, name)) == 1, (name, _served(hub, name))
    links = {os.readlink(job / "pvc" / "model") for job in jobs}
    [link] = links  # one entry for both, by its path inside the pods
    assert PurePosixPath(link).parent == PurePosixPath(manifests.CACHE_MOUNT) / "entries"
    entry = cache / "entries" / PurePosixPath(link).name
    assert {name: (entry / name).read_bytes() for name in files} == files

    [(rjob, trainer)] = controller.trainer_containers(runtime, train_job)
    pod = manifests.pod_spec(rjob)
    env = {
        **controller.resolve_env(trainer, {}),
        **controller.torch_env(runtime, train_job),
        "KF_TORCHRUN": "/bin/echo",  # torchrun's argv is printed: the check is the point
    }
    # The model initializer image carries kf-torchrun too; the torch-runtime image adds PyTorch.
    image = local_images[f"{OUR_PREFIX}model-initializer"]
    volumes = pod_volumes(pod, jobs[0] / "trainer", {"initializer": jobs[0] / "pvc", **claims})

    def trainer_run(container: dict, suffix: str) -> subprocess.CompletedProcess:
        name = f"kf-rt-trainer-{suffix}-{os.getpid()}"
        return _podman(*podman_argv(container, pod, env, volumes, image, name), timeout=120)

    checked = trainer_run(trainer, "shim")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert re.search(r"asset\s+/workspace/model:", checked.stdout + checked.stderr)
    writer = {**trainer, "command": ["sh"], "args": ["-c", (
        "cat /workspace/model/model.safetensors >/dev/null && mkdir /workspace/output && "
        "touch /workspace/model/new 2>&1 | grep 'Read-only file system'"
    )]}  # fmt: skip
    wrote = trainer_run(writer, "writer")
    assert wrote.returncode == 0, f"reads the entry, cannot write it: {wrote.stdout}{wrote.stderr}"
    blind = {**trainer, "volumeMounts": [
        m for m in trainer["volumeMounts"] if m["name"] != manifests.CACHE_VOLUME
    ]}  # fmt: skip
    refused = trainer_run(blind, "blind")
    assert refused.returncode == 4, refused.stdout + refused.stderr
    assert "mount the cache volume" in refused.stdout + refused.stderr

    cron = manifests.asset_cache_object("CronJob")
    job = manifests.cron_job_as_replicated_job(cron)
    [prune] = manifests.containers(job)
    prune_pod = manifests.pod_spec(job)
    pruned = _podman(
        *podman_argv(
            prune, prune_pod, controller.resolve_env(prune, {}),
            pod_volumes(prune_pod, tmp_path / "prune", claims),
            local_images[render.split_image(prune["image"])[0]], f"kf-rt-prune-{os.getpid()}",
        ),
        timeout=120,
    )  # fmt: skip
    assert pruned.returncode == 0, pruned.stdout + pruned.stderr
    assert entry.is_dir() and entry.name in pruned.stdout, "a young entry is kept and listed"


def test_two_dataset_initializer_pods_of_one_indexed_job_fetch_each_file_once_into_one_workspace(
    tmp_path: Path, local_images: dict[str, str], hub: HubServer
):
    """torch-distributed with the sharded-dataset component, K=2: the two pods the controller
    model gives the dataset initializer's Job (one image, SHARDS=2, JOB_COMPLETION_INDEX 0 and 1,
    SHARD_RUN the Job's UID) start together on one workspace volume, the ReadWriteMany claim.
    The Hub holds every file's bytes until both shares are being asked for, so the two pods
    really fetch at once. Both exit 0, the Hub sends each file once, exactly one manifest is
    written, and a trainer pod passes kf-torchrun's asset check on the dataset."""
    shards = 2
    runtime = next(
        doc for doc in render.with_sharded_dataset(shards)
        if doc["metadata"]["name"] == "torch-distributed"
    )  # fmt: skip
    step = "dataset-initializer"
    files = {
        "data/train-00000-of-00003.parquet": os.urandom(3 << 20),
        "data/train-00001-of-00003.parquet": os.urandom(2 << 20),
        "data/train-00002-of-00003.parquet": os.urandom(1 << 20),
        "README.md": b"# a dataset in three parquet files\n",
        "dataset_info.json": b'{"splits": {"train": {"num_examples": 3}}}',
    }
    hub.add_repo("org/sharded-data", files, repo_type="dataset")
    shares = partition([RemoteFile(name, len(body), None) for name, body in files.items()], shards)
    share_of = {f.path.rsplit("/", 1)[-1]: index for index, s in enumerate(shares) for f in s}
    asked: set[int] = set()
    both_asked = threading.Event()

    def hold_bytes_until_both_shares_are_asked_for(record: RequestRecord) -> None:
        if record.method != "GET" or record.path.startswith("/api/"):
            return  # listings and HEADs go through
        url = urlsplit(record.path)
        name = (parse_qs(url.query).get("name") or [url.path.rsplit("/", 1)[-1]])[0]
        if name in share_of:
            asked.add(share_of[name])
            if len(asked) == shards:
                both_asked.set()
        both_asked.wait(45)  # below the initializers' 60 s stall timeout: never retried

    hub.fault = hold_bytes_until_both_shares_are_asked_for
    train_job = {"metadata": {"name": "sharded"}, "spec": {
        "initializer": {"dataset": {
            "storageUri": "hf://datasets/org/sharded-data",
            "env": [{"name": "HF_ENDPOINT", "value": hub.endpoint}],
        }},
        "trainer": {"args": ["train.py"], "env": [
            {"name": "KF_REQUIRE_ASSETS", "value": "/workspace/dataset"},
            {"name": "KF_WAIT_TIMEOUT", "value": "0"},
        ]},
    }}  # fmt: skip
    pods = controller.initializer_pods(runtime, step, train_job, job_uid="3f7c9a1e-job-uid")
    assert len(pods) == shards
    pod_spec = manifests.pod_spec(manifests.step_job(runtime, step))
    workspace = fs_group_volume(tmp_path / "pvc", pod_spec["securityContext"]["fsGroup"])
    running, logs = [], [tmp_path / f"pod-{index}.log" for index in range(shards)]
    for index, pod in enumerate(pods):
        container = controller.step_container(pod, step)
        env = controller.resolve_env(container, {}, pod=pod)
        assert (env["SHARDS"], env["JOB_COMPLETION_INDEX"]) == (str(shards), str(index))
        assert env["SHARD_RUN"] == "3f7c9a1e-job-uid"
        volumes = pod_volumes(pod["spec"], tmp_path / f"pod-{index}", {"initializer": workspace})
        image = local_images[render.split_image(container["image"])[0]]
        name = f"kf-rt-shard-{index}-{os.getpid()}"
        argv = podman_argv(container, pod["spec"], env, volumes, image, name)
        with logs[index].open("wb") as log:
            running.append(subprocess.Popen(
                ["podman", *argv], env=podman_env(), stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT,
            ))  # fmt: skip
    try:
        codes = [process.wait(timeout=300) for process in running]
    finally:
        both_asked.set()
    output = [log.read_text() for log in logs]
    assert codes == [0] * shards, output
    assert both_asked.is_set() and asked == set(range(shards)), (
        "the shares were not fetched at once"
    )

    for name in files:
        served = _served(hub, name.rsplit("/", 1)[-1])
        assert len(served) == 1, (name, served)
    dataset = workspace / "dataset"
    assert {name: (dataset / name).read_bytes() for name in files} == files
    manifests_written = sorted(workspace.rglob(".initializer-manifest*"))
    assert manifests_written == [dataset / ".initializer-manifest.json"], manifests_written
    assert not (dataset / ".initializer-shards").exists(), "the shards' plan outlived the fetch"
    for index, log in enumerate(output):
        assert f"shard {index} (of {shards}, from 0)" in log, log
    assert sum("manifest written" in log for log in output) == 1, output

    [(rjob, trainer)] = controller.trainer_containers(runtime, train_job)
    trainer_pod = manifests.pod_spec(rjob)
    env = {
        **controller.resolve_env(trainer, {}),
        **controller.torch_env(runtime, train_job),
        "KF_TORCHRUN": "/bin/echo",  # torchrun's argv is printed: the check is the point
    }
    volumes = pod_volumes(trainer_pod, tmp_path / "trainer", {"initializer": workspace})
    image = local_images[f"{OUR_PREFIX}model-initializer"]  # carries kf-torchrun too
    name = f"kf-rt-shard-trainer-{os.getpid()}"
    checked = _podman(*podman_argv(trainer, trainer_pod, env, volumes, image, name), timeout=120)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert re.search(r"asset\s+/workspace/dataset:", checked.stdout + checked.stderr)

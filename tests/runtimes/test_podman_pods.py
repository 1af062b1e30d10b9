"""The runtimes' initializer containers, run with podman from the real images (``make e2e``).

Each container spec (args, env after the controller's merge, securityContext, volumes) becomes a
``podman run`` with the settings a kubelet applies: ``runAsUser`` → ``--user``, ``fsGroup`` →
``--group-add`` and a volume owned by that group (setgid, 2775), ``readOnlyRootFilesystem`` →
``--read-only`` with no tmpfs of podman's own, ``allowPrivilegeEscalation: false`` →
``no-new-privileges``, dropped capabilities → ``--cap-drop``; emptyDirs are 0777 host folders.
This proves the securityContext the runtimes declare works with the images as built.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tomllib
from pathlib import Path

import boto3
import pytest

from tests.podman import podman
from tests.runtimes import controller, manifests, render

pytestmark = pytest.mark.images

LOCAL_PREFIX = "localhost/kf-initializers/"
OUR_PREFIX = "ghcr.io/kubeflow-initializers/"
TRAINER_UID = 1000  # the trainer images' user, in the runtimes' fsGroup


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
        argv += ["-v", f"{volumes[mount['name']]}:{mount['mountPath']}"]
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


def run_pod(runtime: dict, step: str, train_job: dict, secrets: dict, root: Path,
            images: dict[str, str]) -> subprocess.CompletedProcess:  # fmt: skip
    rjob = manifests.step_job(runtime, step)
    container = controller.initializer_container(runtime, step, train_job)
    env = controller.resolve_env(container, secrets)
    pod = manifests.pod_spec(rjob)
    volumes = {"initializer": root / "pvc"}
    for volume in pod.get("volumes", []):
        assert "emptyDir" in volume, f"only emptyDir volumes are modelled, not {volume}"
        volumes[volume["name"]] = root / step / volume["name"]
        volumes[volume["name"]].mkdir(parents=True)
        volumes[volume["name"]].chmod(0o777)
    image = images[render.split_image(container["image"])[0]]
    argv = podman_argv(container, pod, env, volumes, image, f"kf-rt-{step}-{os.getpid()}")
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

"""The real Kubeflow SDK (``kubeflow`` 0.5.0, tests/images/requirements.txt) drives TrainJobs
through its local container backend with our initializer images (``make e2e``).

The test starts its own podman API service and points ``ContainerBackendConfig`` at it
(``container_host``, ``pull_policy="Never"``), once with ``container_runtime="podman"`` (the SDK's
podman-py adapter) and once with ``"docker"`` (its docker-py adapter, through podman's
Docker-compatible API: the SDK's docker code path, not a real dockerd). ``HOME`` is a temporary
folder, so the SDK's job folders (``~/.kubeflow/trainer/containers/<job>``) land there.
The SDK puts each job on its own bridge network; the local S3 (moto) and Hub servers listen on
another bridge's gateway, a host address every bridge network reaches. The SDK passes no Hub
endpoint, so the service's containers.conf sets ``HF_ENDPOINT`` (as an operator would for a Hub
mirror). The trainer is a small image built on the local Python base, running as UID 1000 like
the runtimes' trainers; its function (sent by the SDK) checks every file's sha256 under
/workspace.

Both hand-over branches of the images' entrypoint run here: the SDK run as root makes a
root-owned job folder (files go to the image's user 65532:0), and a job folder owned by UID 1000,
as the SDK run by that user makes it (files go to UID 1000, who deletes them in ``delete_job``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
import types
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import ACCESS_KEY, SECRET_KEY
from tests.images.conftest import BUILD_TIMEOUT, IMAGE_UID, owned_dir, owners
from tests.podman import CONTAINERS_CONF, podman
from tests.servers.locked_s3 import LockedS3, locked_s3
from tests.servers.registry import tar_bytes, write_layout

try:
    from kubeflow.trainer import (
        ContainerBackendConfig,
        CustomTrainer,
        HuggingFaceDatasetInitializer,
        HuggingFaceModelInitializer,
        Initializer,
        S3DatasetInitializer,
        S3ModelInitializer,
        TrainerClient,
        TrainingRuntimeSource,
    )
    from kubeflow.trainer.backends.container import backend as container_backend
    from kubeflow.trainer.options import Name
except ImportError as error:  # `make test` collects this module without installing the SDK
    SDK_MISSING: ImportError | None = error
else:
    SDK_MISSING = None

pytestmark = [pytest.mark.images, pytest.mark.timeout(BUILD_TIMEOUT + 600)]

RUNTIME = "kf-e2e-sdk"
TRAINER_IMAGE = "localhost/kf-e2e/sdk-trainer:latest"
TRAINER_UID = 1000  # the runtimes' trainers' UID
HOST_UID = HOST_GID = 1000  # the host user of the non-root case
JOB_LABEL = "trainer.kubeflow.org/trainjob-name"
DATASET = {
    "train.jsonl": b'{"text": "a"}\n' * 2000,
    "data/test-00000-of-00001.parquet": os.urandom(300_000),
}
MODEL = {
    "config.json": b'{"model_type": "llama"}',
    "model.safetensors": os.urandom(1 << 20),
    "tokenizer.json": b'{"version": "1.0"}',
    "pytorch_model.bin": b"left out: the SDK's model initializers send IGNORE_PATTERNS *.bin",
}


def verify_workspace(expected: dict) -> None:
    """Runs in the trainer container (the SDK sends this function's source): /workspace holds
    exactly the expected files, byte for byte, and both completion manifests."""
    import hashlib
    import pathlib
    import sys

    root = pathlib.Path("/workspace")
    found = {}
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root)
        if path.is_file() and not any(part.startswith(".") for part in relative.parts):
            found[str(relative)] = hashlib.sha256(path.read_bytes()).hexdigest()
    manifests = ("dataset", "model")
    missing = [k for k in manifests if not (root / k / ".initializer-manifest.json").is_file()]
    if found != expected or missing:
        print(f"workspace mismatch: found {found}, expected {expected}, no manifest: {missing}")
        sys.exit(1)
    print(f"workspace verified: {len(found)} files")


def expected_files() -> dict[str, str]:
    kept = {f"dataset/{k}": v for k, v in DATASET.items()}
    kept |= {f"model/{k}": v for k, v in MODEL.items() if not k.endswith(".bin")}
    return {path: hashlib.sha256(body).hexdigest() for path, body in kept.items()}


@pytest.fixture(scope="module", autouse=True)
def _sdk_installed() -> None:
    if SDK_MISSING is not None:
        pytest.fail(
            f"the Kubeflow SDK is missing ({SDK_MISSING}): "
            "pip install -r tests/images/requirements.txt"
        )


@pytest.fixture(scope="module")
def trainer_image(images: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> str:
    """The initializers' local Python base, as a non-root trainer (bash and python are all the
    SDK's trainer command needs without torchrun)."""
    labels = json.loads(podman("image", "inspect", images["model"]).stdout)[0]["Config"]["Labels"]
    context = tmp_path_factory.mktemp("trainer")
    (context / "Containerfile").write_text(
        f"FROM {labels['org.opencontainers.image.base.name']}\nUSER {TRAINER_UID}:{TRAINER_UID}\n"
    )
    podman("build", "--quiet", "-t", TRAINER_IMAGE, str(context), timeout=300)
    return TRAINER_IMAGE


@pytest.fixture(scope="module")
def runtime_source(trainer_image: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding one ClusterTrainingRuntime (JSON is YAML) whose node runs the trainer
    image: the SDK reads no runtime from GitHub."""
    folder = tmp_path_factory.mktemp("runtimes")
    node = {"name": "node", "image": trainer_image}
    job = {"template": {"spec": {"template": {"spec": {"containers": [node]}}}}}
    runtime = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": RUNTIME, "labels": {"trainer.kubeflow.org/framework": "torch"}},
        "spec": {
            "mlPolicy": {"numNodes": 1},
            "template": {"spec": {"replicatedJobs": [{"name": "node", **job}]}},
        },
    }
    (folder / f"{RUNTIME}.yaml").write_text(json.dumps(runtime, indent=2))
    return folder


def with_env(conf: str, env: dict[str, str]) -> str:
    """containers.conf text with an ``env`` list for every container in its [containers]."""
    line = "env = " + json.dumps([f"{key}={value}" for key, value in env.items()])
    assert "\n[containers]\n" in conf
    return conf.replace("\n[containers]\n", f"\n[containers]\n{line}\n", 1)


@pytest.fixture(scope="module")
def podman_socket(bridge_hub, bridge_registry) -> Iterator[str]:
    """``unix://...`` of a podman API service this module starts, with the project's
    containers.conf plus the Hub's address and the plain-http registry for every container."""
    folder = Path(tempfile.mkdtemp(prefix="kf-e2e-podman-"))
    conf = folder / "containers.conf"
    env = {"HF_ENDPOINT": bridge_hub.endpoint, "HF_HUB_DISABLE_XET": "1"}
    env["OCI_INSECURE_REGISTRIES"] = bridge_registry.host
    conf.write_text(with_env(CONTAINERS_CONF.read_text(), env))
    socket = folder / "podman.sock"
    log = (folder / "service.log").open("w")
    service = subprocess.Popen(
        ["podman", "system", "service", "--time=0", f"unix://{socket}"],
        env={**os.environ, "CONTAINERS_CONF": str(conf)},
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 30
        while not socket.exists():
            if service.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"podman system service did not start: {service.args}")
            time.sleep(0.1)
        yield f"unix://{socket}"
    finally:
        service.terminate()
        try:
            service.wait(timeout=20)
        except subprocess.TimeoutExpired:
            service.kill()
            service.wait()
        log.close()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def home(open_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The SDK's HOME: its job folders go to HOME/.kubeflow/trainer/containers/."""
    monkeypatch.setenv("HOME", str(open_tmp))
    return open_tmp


@pytest.fixture(params=["podman", "docker"])
def client(
    request: pytest.FixtureRequest,
    podman_socket: str,
    images: dict[str, str],
    runtime_source: Path,
    home: Path,
):
    """The SDK with its podman adapter (podman-py), or its docker one (docker-py) talking to
    podman's Docker-compatible API on the same socket, as a docker user's SDK would."""
    config = ContainerBackendConfig(
        container_runtime=request.param,
        container_host=podman_socket,
        pull_policy="Never",
        dataset_initializer_image=images["dataset"],
        model_initializer_image=images["model"],
        runtime_source=TrainingRuntimeSource(sources=[str(runtime_source)]),
        initializer_timeout=300,
    )
    return TrainerClient(backend_config=config)


@pytest.fixture
def job() -> Iterator[str]:
    """A fresh TrainJob name; whatever of it a failed test leaves is removed afterwards."""
    name = f"e2e{uuid.uuid4().hex[:10]}"
    yield name
    filter_ = ("--filter", f"label={JOB_LABEL}={name}", "--format", "{{.Names}}")
    left = podman("ps", "--all", *filter_, check=False).stdout.split()
    if left:
        podman("rm", "--force", "--time", "0", *left, check=False)
    podman("network", "rm", "--force", f"{name}-net", check=False)


def job_folder(home: Path, name: str) -> Path:
    return home / ".kubeflow" / "trainer" / "containers" / name


def leftovers(home: Path, name: str) -> list[str]:
    """Containers, the network and the folder of TrainJob ``name`` that still exist."""
    filter_ = ("--filter", f"label={JOB_LABEL}={name}", "--format", "{{.Names}}")
    left = podman("ps", "--all", *filter_).stdout.split()
    if podman("network", "exists", f"{name}-net", check=False).returncode == 0:
        left.append(f"network {name}-net")
    folder = job_folder(home, name)
    if folder.exists():
        left += [f"file {p}" for p in [folder, *folder.rglob("*")]]
    return left


def as_user(uid: int, gid: int, function: Callable[..., object]) -> Callable[..., None]:
    """``function`` run in a child process that is ``uid:gid`` with no other group."""

    def run(*args: object, **kwargs: object) -> None:
        pid = os.fork()
        if pid == 0:  # the child
            code = 1
            try:
                os.setgroups([])
                os.setgid(gid)
                os.setuid(uid)
                function(*args, **kwargs)
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, f"{function} failed as {uid}:{gid}"

    return run


def train_and_verify(client, name: str, initializer) -> str:
    """``train()`` with the verifying trainer, wait for it; the trainer's log."""
    returned = client.train(
        runtime=RUNTIME,
        initializer=initializer,
        trainer=CustomTrainer(func=verify_workspace, func_args={"expected": expected_files()}),
        options=[Name(name)],
    )
    assert returned == name
    trainjob = client.wait_for_job_status(name, timeout=300, polling_interval=1)
    assert trainjob.status == "Complete"
    assert [step.name for step in trainjob.steps] == ["node-0"], "initializers removed on success"
    # The SDK's podman adapter (with podman-py 5.x) returns no log text: read it with podman.
    log = podman("logs", f"{name}-node-0").stdout
    assert f"workspace verified: {len(expected_files())} files" in log, log
    return log


def test_s3_dataset_and_model_into_the_root_owned_folder_the_sdk_makes_as_root(
    client, job, home, bridge_s3
):
    objects = {f"dataset/{k}": v for k, v in DATASET.items()}
    objects |= {f"model/{k}": v for k, v in MODEL.items()}
    bucket = bridge_s3.bucket(f"sdk-{job}", objects)
    keys = {
        "endpoint": bridge_s3.endpoint,
        "access_key_id": ACCESS_KEY,
        "secret_access_key": SECRET_KEY,
    }
    initializer = Initializer(
        dataset=S3DatasetInitializer(storage_uri=f"s3://{bucket}/dataset", **keys),
        model=S3ModelInitializer(storage_uri=f"s3://{bucket}/model", **keys),
    )

    train_and_verify(client, job, initializer)

    folder = job_folder(home, job)
    assert (folder.stat().st_uid, folder.stat().st_mode & 0o7777) == (0, 0o755)
    assert sorted(os.listdir(folder)) == ["dataset", "model"]
    for kind in ("dataset", "model"):
        assert owners(folder / kind) == {(IMAGE_UID, 0)}, "a root-owned folder: the image's user"
    client.delete_job(job)
    assert leftovers(home, job) == []


def test_hub_dataset_and_model_into_a_host_users_folder_that_user_deletes(
    client, job, home, bridge_hub, monkeypatch
):
    # HOME and the job folder as the SDK run by UID 1000 makes them (os.makedirs, mode 0755).
    folder = job_folder(home, job)
    for path in (home, home / ".kubeflow", folder.parent.parent, folder.parent, folder):
        owned_dir(path, uid=HOST_UID, gid=HOST_GID, mode=0o755)
    bridge_hub.add_repo(f"org/corpus-{job}", DATASET, repo_type="dataset")
    bridge_hub.add_repo(f"org/llama-{job}", MODEL)
    initializer = Initializer(
        dataset=HuggingFaceDatasetInitializer(storage_uri=f"hf://org/corpus-{job}"),
        model=HuggingFaceModelInitializer(storage_uri=f"hf://org/llama-{job}"),
    )

    train_and_verify(client, job, initializer)

    assert sorted(os.listdir(folder)) == ["dataset", "model"]
    assert owners(folder) == {(HOST_UID, HOST_GID)}, "everything in it belongs to that user"
    # delete_job as that user: the SDK's own rmtree call, made by UID 1000.
    sdk_shutil = types.SimpleNamespace(rmtree=as_user(HOST_UID, HOST_GID, shutil.rmtree))
    monkeypatch.setattr(container_backend, "shutil", sdk_shutil)
    client.delete_job(job)
    assert leftovers(home, job) == []


@pytest.fixture(scope="module")
def bridge_locked_s3(bridge_network) -> Iterator[LockedS3]:
    """An S3 server that checks signatures (tests/servers/locked_s3.py), on the gateway."""
    with locked_s3(bridge_network.gateway) as server:
        yield server


def test_an_oci_modelcar_given_as_the_sdk_storage_uri_reaches_the_trainer(
    client, job, home, bridge_hub, bridge_registry, tmp_path
):
    # The SDK has no initializer type of its own for oci://; its Hugging Face one passes
    # storage_uri (and its default IGNORE_PATTERNS) to our image unchanged.
    layout = tmp_path / "modelcar"
    write_layout(layout, [tar_bytes({f"models/{k}": v for k, v in MODEL.items()})])
    bridge_registry.push_layout(layout, f"sdk/{job}:v1")
    bridge_hub.add_repo(f"org/corpus-{job}", DATASET, repo_type="dataset")
    initializer = Initializer(
        dataset=HuggingFaceDatasetInitializer(storage_uri=f"hf://org/corpus-{job}"),
        model=HuggingFaceModelInitializer(
            storage_uri=f"oci://{bridge_registry.ref(f'sdk/{job}:v1')}"
        ),
    )

    train_and_verify(client, job, initializer)

    client.delete_job(job)
    assert leftovers(home, job) == []


@pytest.mark.parametrize(
    ("failing", "mistake", "code", "reason"),
    [
        (
            "model",
            {"secret_access_key": "wrong-secret-key"},
            3,
            "access denied (SignatureDoesNotMatch)",
        ),
        (
            "dataset",
            {"storage_uri": "s3://no-such-bucket-kf-e2e/"},
            4,
            "bucket 'no-such-bucket-kf-e2e' does not exist",
        ),
    ],
    ids=["wrong-secret-key-exits-3", "missing-bucket-exits-4"],
)
def test_a_failing_initializer_makes_train_raise_with_its_exit_code_and_leaves_nothing(
    client, job, home, bridge_locked_s3, monkeypatch, failing, mistake, code, reason
):
    # Whole buckets: moto's signature check also refuses valid signatures of listings with a
    # prefix, so the other initializer, with good keys, shows that only the mistake fails.
    s3 = bridge_locked_s3
    settings = {}
    for kind, files in (("dataset", DATASET), ("model", MODEL)):
        bucket = f"sdk-{job}-{kind}"
        s3.client().create_bucket(Bucket=bucket)  # type: ignore[attr-defined]
        for key, body in files.items():
            s3.client().put_object(Bucket=bucket, Key=key, Body=body)  # type: ignore[attr-defined]
        settings[kind] = {
            "storage_uri": f"s3://{bucket}/",
            "endpoint": s3.endpoint,
            "access_key_id": s3.access_key,
            "secret_access_key": s3.secret_key,
        }
    settings[failing] |= mistake
    initializer = Initializer(
        dataset=S3DatasetInitializer(**settings["dataset"]),
        model=S3ModelInitializer(**settings["model"]),
    )
    outcomes: dict[str, str] = {}
    run_one = container_backend.ContainerBackend._run_single_initializer

    def recording(self, *args, container_init, **kwargs):
        try:
            run_one(self, *args, container_init=container_init, **kwargs)
        except Exception as exc:
            outcomes[container_init.name] = str(exc)
            raise
        outcomes[container_init.name] = "ok"

    monkeypatch.setattr(container_backend.ContainerBackend, "_run_single_initializer", recording)

    with pytest.raises(RuntimeError) as raised:
        client.train(
            runtime=RUNTIME,
            initializer=initializer,
            trainer=CustomTrainer(func=verify_workspace, func_args={"expected": {}}),
            options=[Name(job)],
        )
    message = f"{failing}-initializer failed with exit code {code}."
    assert str(raised.value).startswith(message)
    if client.backend._runtime_type == "docker":  # the podman adapter loses the log tail
        error_lines = [line for line in str(raised.value).splitlines() if ": error: " in line]
        assert len(error_lines) == 1 and reason in error_lines[0], str(raised.value)
        assert "wrong-secret-key" not in str(raised.value)
    other = "model" if failing == "dataset" else "dataset"
    assert outcomes[f"{other}-initializer"] == "ok"
    assert outcomes[f"{failing}-initializer"].startswith(message)
    assert leftovers(home, job) == [], "train() removes the job's containers, network, folder"

"""The contract end to end, for every worked example TrainJob in runtimes/examples/.

For each example: apply the controller's merge (storageUri → STORAGE_URI, env upserted by name,
secretRef keys as env) to the rendered runtime's initializer containers, run both initializers
in parallel exactly as their containers would run (see :mod:`tests.runtimes.pods`) against real
local servers (moto S3, the Hub stand-in), then check that every path the trainer's command and
env read under /workspace is there, complete according to the initializer manifest.

The only change made to an example is the one a user makes for a private mirror: endpoint env
upserted into its initializers (ENDPOINT for S3, HF_ENDPOINT for the Hub), and the example
Secrets' placeholder values replaced by the local servers' credentials. Each example runs on its
runtime as installed, with the asset-cache component (runtimes/components/asset-cache), whose
claim is one more folder shared by every pod, with the sharded-dataset component
(runtimes/components/sharded-dataset: every pod of the dataset initializer's Indexed Job, with
the index and run the controller model gives it) and with both.
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from initializers.manifest import find_problems
from tests.runtimes import controller, manifests, pods, render
from tests.servers.hub import HubServer
from tests.servers.registry import tar_bytes, write_layout

Obj = dict[str, Any]
STEPS = manifests.INITIALIZER_STEPS
EXAMPLES = manifests.example_files()
VARIANTS = ("plain", "asset-cache", "sharded-dataset", "asset-cache+sharded-dataset")
# K for the sharded variants: one pod per file of DATASET_FILES, and few processes on 2 cores.
E2E_SHARDS = 2
TEST_HF_TOKEN = "hf_runtime_contract_token"
TEST_SECRETS = {
    "ACCESS_KEY_ID": "AKIARUNTIMECONTRACT0",
    "SECRET_ACCESS_KEY": "runtime-contract-secret-do-not-leak",
    "HF_TOKEN": TEST_HF_TOKEN,
    "ACCESS_TOKEN": TEST_HF_TOKEN,
    # An imagePullSecret's key; the local registry asks for no credentials, so any valid config
    ".dockerconfigjson": '{"auths": {}}',
}
WORKSPACE_PATH = re.compile(r"/workspace(?:/[^\s,=:]*)?")
# What a trainer argument needs inside the folder it names, beyond existing.
NEEDS_INSIDE = {
    "checkpointer.checkpoint_dir": ("config.json", "*.safetensors"),
    "dataset.data_dir": ("*.parquet",),
}

MODEL_FILES: dict[str, bytes] = {
    "config.json": b'{"architectures": ["Qwen2ForCausalLM"], "hidden_size": 16}',
    "generation_config.json": b"{}",
    "tokenizer.json": b'{"model": {"type": "BPE"}}',
    "tokenizer_config.json": b"{}",
    "vocab.json": b'{"a": 0, "b": 1}',
    "merges.txt": b"#version: 0.2\na b\n",
    "model.safetensors": os.urandom(256 * 1024),
    "pytorch_model.bin": b"duplicate pickled weights the model initializer skips",
    "original/consolidated.00.pth": b"original checkpoint",
    "original/params.json": b"{}",
    "README.md": b"# test model\n",
}
DATASET_FILES: dict[str, bytes] = {
    "README.md": b"# test dataset\n",
    "data/train-00000-of-00001.parquet": os.urandom(64 * 1024),
}


def _example_id(path: Path) -> str:
    return path.stem


# ---- servers and their content --------------------------------------------------------------


@pytest.fixture(scope="module")
def hub() -> Iterator[HubServer]:
    with HubServer() as server:
        server.tokens = {TEST_HF_TOKEN}
        yield server


@pytest.fixture(scope="module")
def s3(s3_endpoint: str):
    return boto3.client(
        "s3", endpoint_url=s3_endpoint, region_name="us-east-1",
        aws_access_key_id=TEST_SECRETS["ACCESS_KEY_ID"],
        aws_secret_access_key=TEST_SECRETS["SECRET_ACCESS_KEY"],
    )  # fmt: skip


def _files_for(step: str) -> dict[str, bytes]:
    return MODEL_FILES if step == "model-initializer" else DATASET_FILES


def seed(uri: str, step: str, gated: bool, hub: HubServer, s3: Any, cloud: Any = None) -> None:
    """Put content at ``uri`` on the local servers (once per URI); a ``gated`` Hub repo serves
    its files only to the test token, as Llama's does to accounts that accepted its licence.
    ``cloud`` looks up the GCS and Azure emulators by scheme, started only when asked for."""
    scheme, _, location = uri.partition("://")
    if scheme == "oci":  # a modelcar: the files under /models of an image
        registry = cloud("oci")
        target = location.split("/", 1)[1]
        layout = registry.root / "layouts" / target.replace("/", "-").replace(":", "-")
        if not layout.exists():
            files = {f"models/{name}": body for name, body in _files_for(step).items()}
            write_layout(layout, [tar_bytes(dict(files))])
            registry.push_layout(layout, target)
        return
    if scheme in ("gs", "az"):
        bucket, _, prefix = location.partition("/")
        emulator = cloud(scheme)
        (emulator.create_bucket if scheme == "gs" else emulator.create_container)(bucket)
        for name, body in _files_for(step).items():
            emulator.put(bucket, f"{prefix.rstrip('/')}/{name}", body)
        return
    if scheme == "hf":
        location = location.split("@", 1)[0]
        repo_type = "dataset" if location.startswith("datasets/") else "model"
        repo_id = "/".join(location.removeprefix("datasets/").split("/")[:2])
        try:
            hub.sha(repo_id, repo_type=repo_type)
        except KeyError:
            hub.add_repo(
                repo_id, _files_for(step), repo_type=repo_type,
                gated="manual" if gated else False, access=[TEST_HF_TOKEN],
            )  # fmt: skip
    elif scheme == "s3":
        bucket, _, prefix = location.partition("/")
        existing = {b["Name"] for b in s3.list_buckets()["Buckets"]}
        if bucket not in existing:
            s3.create_bucket(Bucket=bucket)
        for name, body in _files_for(step).items():
            s3.put_object(Bucket=bucket, Key=f"{prefix.rstrip('/')}/{name}", Body=body)
        s3.put_object(Bucket=bucket, Key=f"{prefix.rstrip('/')}-v2/other", Body=b"sibling")
    else:
        raise AssertionError(f"no local server for {uri}")


# ---- the example, pointed at the local servers ---------------------------------------------


def load_example(path: Path) -> tuple[Obj, dict[str, dict[str, str]]]:
    train_job, secrets = None, {}
    for doc in manifests.load_documents(path):
        if doc["kind"] == "TrainJob":
            train_job = doc
        elif doc["kind"] == "Secret":
            keys = controller.secret_data(doc)
            unknown = set(keys) - set(TEST_SECRETS)
            assert not unknown, f"{path}: no local credential for Secret keys {unknown}"
            secrets[doc["metadata"]["name"]] = {key: TEST_SECRETS[key] for key in keys}
    assert train_job is not None, f"{path} holds no TrainJob"
    return train_job, secrets


def point_at_local_servers(
    train_job: Obj, secrets: dict, runtime: Obj, hub: HubServer, s3_endpoint: str, cloud: Any = None
) -> Obj:
    """The TrainJob with endpoint env upserted into each initializer that fetches something:
    for GCS the emulator's address; for Azure a connection string naming the emulator (its
    development key stands in for the workload identity that cannot run here); for an OCI
    registry, the local registry's address in place of the example's (as a private mirror's
    would be), named as a plain-http one."""
    local = copy.deepcopy(train_job)
    initializer = local["spec"].setdefault("initializer", {})
    for step, field in controller.STEP_FIELD.items():
        uri = _storage_uri(runtime, step, local, secrets)
        if not uri:
            continue
        spec = initializer.setdefault(field, {})
        if uri.startswith("hf://"):
            endpoint = {"name": "HF_ENDPOINT", "value": hub.endpoint}
        elif uri.startswith("gs://"):
            endpoint = {"name": "STORAGE_EMULATOR_HOST", "value": cloud("gs").url}
        elif uri.startswith("az://"):
            connection = cloud("az").connection_string()
            endpoint = {"name": "AZURE_STORAGE_CONNECTION_STRING", "value": connection}
        elif uri.startswith("oci://"):
            host = cloud("oci").host
            spec["storageUri"] = "oci://" + "/".join([host, *uri.split("/")[3:]])
            endpoint = {"name": "OCI_INSECURE_REGISTRIES", "value": host}
        else:
            endpoint = {"name": "ENDPOINT", "value": s3_endpoint}
        spec["env"] = controller.upsert_env(spec.get("env", []), [endpoint])
    return local


def _storage_uri(runtime: Obj, step: str, train_job: Obj, secrets: dict) -> str:
    return first_pod_env(runtime, step, train_job, secrets).get("STORAGE_URI", "")


def first_pod_env(runtime: Obj, step: str, train_job: Obj, secrets: dict) -> dict[str, str]:
    """The environment of the ``step`` initializer's first pod (the one pod, unless sharded)."""
    pod = controller.initializer_pods(runtime, step, train_job, job_uid=f"uid-of-{step}")[0]
    return controller.resolve_env(controller.step_container(pod, step), secrets, pod=pod)


def rendered_runtime(name: str, variant: str = "plain") -> Obj:
    if variant == "plain":
        docs = render.render_subset(manifests.RUNTIMES_DIR)
    elif variant == "asset-cache":
        docs = render.with_component(manifests.ASSET_CACHE_DIR)
    else:
        docs = render.with_sharded_dataset(E2E_SHARDS, asset_cache="asset-cache" in variant)
    for doc in docs:
        if doc["metadata"]["name"] == name:
            return doc
    raise KeyError(name)


def claims(runtime: Obj, root: Path) -> dict[str, Path]:
    """Volume name → host folder, for the TrainJob's volume (``root/pvc``) and each claim the
    runtime's pods mount (``root/claims/<claim>``), every one shared by all the pods."""
    shared = {"initializer": root / "pvc"}
    for rjob in manifests.replicated_jobs(runtime):
        for volume in manifests.pod_spec(rjob).get("volumes", []):
            if claim := volume.get("persistentVolumeClaim"):
                shared[volume["name"]] = root / "claims" / claim["claimName"]
    return shared


def start_step(
    runtime: Obj, step: str, container: Obj, env: dict, root: Path, shared: dict
) -> pods.Running:
    """Start the ``step`` initializer as its pod would run it: as the pod's user."""
    user = pods.run_as(manifests.pod_spec(manifests.step_job(runtime, step)), container)
    return pods.start(container, env, root, shared, user=user)


def run_initializers(runtime: Obj, train_job: Obj, secrets: dict, root: Path) -> dict:
    """Every pod of both initializer Jobs, started together as JobSet does, each with the env
    the controller model gives it (its index, its Job's UID); pod → (container, Finished), a
    pod named by its step when its Job has one pod, else ``<step>-<index>``."""
    shared = claims(runtime, root)
    running = {}
    for step in STEPS:
        pods = controller.initializer_pods(runtime, step, train_job, job_uid=f"uid-of-{step}")
        for number, pod in enumerate(pods):
            key = step if len(pods) == 1 else f"{step}-{number}"
            container = controller.step_container(pod, step)
            env = controller.resolve_env(container, secrets, pod=pod)
            running[key] = (
                container,
                start_step(runtime, step, container, env, root / key, shared),
            )
    return {key: (container, proc.wait()) for key, (container, proc) in running.items()}


# ---- what the trainer reads ----------------------------------------------------------------


def trainer_reads(container: Obj) -> list[tuple[str, str]]:
    """(the argument or env var, /workspace path) for everything the trainer reads."""
    reads = []
    for token in [*container.get("command", []), *container.get("args", [])]:
        key = token.split("=", 1)[0] if "=" in token else token
        for path in WORKSPACE_PATH.findall(token):
            reads.append((key, path))
    for var in container.get("env", []):
        for path in WORKSPACE_PATH.findall(var.get("value", "")):
            reads.append((var["name"], path))
    return [(key, path) for key, path in reads
            if path != "/workspace" and not path.startswith("/workspace/output")]  # fmt: skip


def asset_root(path: str) -> str:
    return "/".join(path.split("/")[:3])  # /workspace/<asset>


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("example", EXAMPLES, ids=[_example_id(p) for p in EXAMPLES])
def test_example_trainjob_gets_its_assets_where_its_trainer_reads_them(
    example: Path,
    variant: str,
    tmp_path: Path,
    hub: HubServer,
    s3: Any,
    s3_endpoint: str,
    request: pytest.FixtureRequest,
):
    train_job, secrets = load_example(example)
    runtime = rendered_runtime(train_job["spec"]["runtimeRef"]["name"], variant)

    def cloud(scheme: str) -> Any:
        fixtures = {"gs": "gcs_emulator", "az": "azurite", "oci": "registry"}
        return request.getfixturevalue(fixtures[scheme])

    train_job = point_at_local_servers(train_job, secrets, runtime, hub, s3_endpoint, cloud)
    for step in STEPS:
        env = first_pod_env(runtime, step, train_job, secrets)
        assert env.get("STORAGE_URI"), f"{example.name}: {step} has nothing to fetch"
        gated = any(key in env for key in ("HF_TOKEN", "ACCESS_TOKEN"))
        seed(env["STORAGE_URI"], step, gated, hub, s3, cloud)

    results = run_initializers(runtime, train_job, secrets, tmp_path)

    for step, (container, finished) in results.items():
        assert finished.code == 0, (
            f"{step} exited {finished.code}: {finished.termination_message}\n{finished.output}"
        )
        for secret in TEST_SECRETS.values():
            assert secret not in finished.output, f"{step} printed a credential"
        limit = container["resources"]["limits"]["memory"]
        assert finished.max_rss_bytes < _bytes(limit), f"{step} peaked above its {limit} limit"
        print(f"{example.stem} {step}: peak RSS {finished.max_rss_bytes} B")

    if "sharded-dataset" in variant:  # K pods, each its share; the last one wrote the manifest
        logs = [results[f"dataset-initializer-{i}"][1].output for i in range(E2E_SHARDS)]
        for index, log in enumerate(logs):
            assert f"shard {index} (of {E2E_SHARDS}, from 0)" in log, log
        assert sum("manifest written" in log for log in logs) == 1, logs
    pvc = tmp_path / "pvc"
    if "asset-cache" in variant:  # the outputs are links into the shared claim's entries
        entries = claims(runtime, tmp_path)[manifests.CACHE_VOLUME] / "entries"
        for output in ("model", "dataset"):
            assert (pvc / output).is_symlink(), f"{output} was not fetched through the cache"
            assert (pvc / output).resolve().parent == entries.resolve()
    trainers = controller.trainer_containers(runtime, train_job)
    assert trainers, "the runtime has no trainer container"
    for _, trainer in trainers:
        reads = trainer_reads(trainer)
        assert {asset_root(p) for _, p in reads} >= {"/workspace/model", "/workspace/dataset"}
        for key, path in reads:
            host = pvc / Path(path).relative_to("/workspace")
            assert host.exists(), f"{key} reads {path}, which the initializers did not create"
            if host.is_dir():
                assert any(host.iterdir()), f"{key} reads {path}, which is empty"
            for pattern in NEEDS_INSIDE.get(key, ()):
                assert list(host.glob(pattern)), f"{key}={path} has no {pattern}"
            problems = find_problems(pvc / Path(asset_root(path)).relative_to("/workspace"))
            assert not problems, f"{key} reads {path}: " + "; ".join(problems)
        if trainer.get("command", [None])[0] == "kf-torchrun":
            check_torch_shim_accepts_the_assets(runtime, train_job, trainer, tmp_path)


def check_torch_shim_accepts_the_assets(
    runtime: Obj, train_job: Obj, trainer: Obj, root: Path
) -> None:
    """Run the real ``kf-torchrun`` with the trainer's merged env and the controller's PET_*:
    it must find every required asset complete and hand the user's args to torchrun. torchrun
    itself is ``/bin/echo`` here (KF_TORCHRUN; PyTorch is not in the default test environment,
    the launcher suite runs the real one), so its argv is what the shim printed."""
    env = {**controller.resolve_env(trainer, {}), **controller.torch_env(runtime, train_job)}
    required = [p for p in env.get("KF_REQUIRE_ASSETS", "").split(",") if p]
    assert required, "the trainer requires no assets"
    env["KF_TORCHRUN"] = "/bin/echo"
    running = pods.start(trainer, env, root / "trainer", claims(runtime, root))
    finished = running.wait()
    assert finished.code == 0, f"kf-torchrun refused to start:\n{finished.output}"
    for path in required:
        assert f"asset           {running.pod.host_path(path)}:" in finished.output
    launched = finished.output.strip().splitlines()[-1].split()
    assert launched[-len(trainer["args"]) :] == trainer["args"], finished.output


def _bytes(quantity: str) -> int:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30}
    return int(quantity[:-2]) * units[quantity[-2:]]


def test_env_and_secret_from_the_example_reach_the_initializer(tmp_path, hub, s3, s3_endpoint):
    """IGNORE_PATTERNS from the TrainJob and the token from its Secret change what is fetched."""
    example = manifests.EXAMPLES_DIR / "deepspeed-distributed.yaml"
    train_job, secrets = load_example(example)
    runtime = rendered_runtime("deepspeed-distributed")
    train_job = point_at_local_servers(train_job, secrets, runtime, hub, s3_endpoint)
    for step in STEPS:
        env = controller.resolve_env(
            controller.initializer_container(runtime, step, train_job), secrets
        )
        seed(env["STORAGE_URI"], step, "HF_TOKEN" in env, hub, s3)

    results = run_initializers(runtime, train_job, secrets, tmp_path)
    assert all(finished.code == 0 for _, finished in results.values())
    model = tmp_path / "pvc" / "model"
    assert (model / "model.safetensors").is_file()
    assert not (model / "original").exists(), "IGNORE_PATTERNS=original/* was not applied"

    without_secret = copy.deepcopy(train_job)
    del without_secret["spec"]["initializer"]["model"]["secretRef"]
    container = controller.initializer_container(runtime, "model-initializer", without_secret)
    env = controller.resolve_env(container, {})
    env["OUTPUT_PATH"] = "/workspace/model-anonymous"
    finished = start_step(
        runtime,
        "model-initializer",
        container,
        env,
        tmp_path / "anon",
        {"initializer": tmp_path / "pvc"},
    ).wait()
    assert finished.code == 3, f"a gated repo without the Secret's token: {finished.output}"


def test_trainjob_without_initializer_settings_completes_both_initializers_with_nothing_fetched(
    tmp_path: Path,
):
    runtime = rendered_runtime("torch-distributed")
    train_job = {"spec": {"runtimeRef": {"name": "torch-distributed"}}}
    results = run_initializers(runtime, train_job, {}, tmp_path)
    for step, (_, finished) in results.items():
        assert finished.code == 0, f"{step}: {finished.output}"
        assert "nothing to fetch" in finished.output
    assert not any((tmp_path / "pvc").iterdir())


@pytest.mark.parametrize("require", ["default", "model only"])
def test_trainjob_fetching_only_a_model_must_say_so_to_the_shim(
    require: str, tmp_path: Path, hub: HubServer
):
    """torch-distributed requires both assets by default; a TrainJob that fetches only a model
    names /workspace/model in KF_REQUIRE_ASSETS (README), else the shim refuses at once (exit 4)."""
    runtime = rendered_runtime("torch-distributed")
    train_job: Obj = {
        "metadata": {"name": "model-only"},
        "spec": {
            "runtimeRef": {"name": "torch-distributed"},
            "initializer": {
                "model": {
                    "storageUri": "hf://org/model-only",
                    "env": [{"name": "HF_ENDPOINT", "value": hub.endpoint}],
                }
            },
            # Look once instead of the runtime's grace period: the refusal is what is tested.
            "trainer": {"args": ["train.py"], "env": [{"name": "KF_WAIT_TIMEOUT", "value": "0"}]},
        },
    }
    if require == "model only":
        train_job["spec"]["trainer"]["env"].append(
            {"name": "KF_REQUIRE_ASSETS", "value": "/workspace/model"}
        )
    seed("hf://org/model-only", "model-initializer", False, hub, None)
    results = run_initializers(runtime, train_job, {}, tmp_path)
    assert [finished.code for _, finished in results.values()] == [0, 0]
    assert not (tmp_path / "pvc" / "dataset").exists()

    [(_, trainer)] = controller.trainer_containers(runtime, train_job)
    env = {**controller.resolve_env(trainer, {}), **controller.torch_env(runtime, train_job)}
    env["KF_TORCHRUN"] = "/bin/echo"
    finished = pods.start(trainer, env, tmp_path / "trainer", {"initializer": tmp_path / "pvc"})
    result = finished.wait()
    if require == "default":
        assert result.code == 4, result.output
        assert "dataset/.initializer-manifest.json is missing" in result.output
    else:
        assert result.code == 0, result.output

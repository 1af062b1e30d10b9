"""The images fetch for real from local S3 and Hub servers into a bind-mounted /workspace.

Host networking, so the containers reach the servers on 127.0.0.1. Configured once by flags
(`docker run IMAGE --storage-uri ...`) and once by the environment alone (as the controller runs
them); failures end with the documented exit code and a one-line termination message.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from initializers.manifest import find_problems, read_manifest
from tests.conftest import ACCESS_KEY, SECRET_KEY, tree
from tests.images.conftest import BUILD_TIMEOUT, IMAGE_UID, owned_dir

pytestmark = [pytest.mark.images, pytest.mark.timeout(BUILD_TIMEOUT + 300)]

MODEL = {
    "config.json": b'{"model_type": "llama"}',
    "model.safetensors": os.urandom(2 << 20),
    "tokenizer.json": b'{"version": "1.0"}',
    "pytorch_model.bin": b"legacy weights, left out by the model defaults",
}
MODEL_FETCHED = ("config.json", "model.safetensors", "tokenizer.json")
DATASET = {
    "README.md": b"# a dataset card",
    "data/train-00000-of-00001.parquet": os.urandom(1 << 20),
    "data/test.jsonl": b'{"text": "hello"}\n',
}
FILES = {"model": MODEL, "dataset": DATASET}
EXPECTED = {"model": {n: MODEL[n] for n in MODEL_FETCHED}, "dataset": DATASET}
HUB_REPO = {"model": "org/llama", "dataset": "org/corpus"}
HUB_URI = {"model": "hf://org/llama", "dataset": "hf://datasets/org/corpus"}
NO_XET = {"HF_HUB_DISABLE_XET": "1"}
S3_KEYS = {"ACCESS_KEY_ID": ACCESS_KEY, "SECRET_ACCESS_KEY": SECRET_KEY}


def fill_s3(bucket, kind: str) -> str:
    for key, body in FILES[kind].items():
        bucket.put(f"{kind}s/v1/{key}", body)
    return bucket.uri(f"{kind}s/v1")


def fill_hub(hub, kind: str) -> str:
    hub.add_repo(HUB_REPO[kind], FILES[kind], repo_type=kind)
    return HUB_URI[kind]


def assert_complete(dest: Path, kind: str, uri: str) -> None:
    assert tree(dest) == EXPECTED[kind]
    assert find_problems(dest) == []
    manifest = read_manifest(dest)
    assert manifest is not None and manifest.source == uri
    assert all(p.stat().st_uid == IMAGE_UID for p in dest.rglob("*")), "written as non-root"


@pytest.mark.parametrize("kind", ["dataset", "model"])
def test_flags_fetch_from_s3_into_the_default_folder(images, podman_run, bucket, workspace, kind):
    uri = fill_s3(bucket, kind)
    result = podman_run(
        images[kind],
        *("--storage-uri", uri, "--endpoint", bucket.endpoint),
        env=S3_KEYS,
        volumes={workspace: "/workspace"},
    )
    assert result.code == 0, result.output
    assert_complete(workspace / kind, kind, uri)


@pytest.mark.parametrize("kind", ["dataset", "model"])
def test_env_alone_fetches_from_s3_as_the_controller_runs_it(
    images, podman_run, bucket, workspace, kind
):
    uri = fill_s3(bucket, kind)
    result = podman_run(
        images[kind],
        env={"STORAGE_URI": uri, "ENDPOINT": bucket.endpoint, **S3_KEYS},
        volumes={workspace: "/workspace"},
    )
    assert result.code == 0, result.output
    assert_complete(workspace / kind, kind, uri)


@pytest.mark.parametrize("kind", ["dataset", "model"])
def test_flags_fetch_from_the_hub_into_a_chosen_folder(images, podman_run, hub, workspace, kind):
    uri = fill_hub(hub, kind)
    result = podman_run(
        images[kind],
        *("--storage-uri", uri, "--output", "/workspace/out"),
        env={"HF_ENDPOINT": hub.endpoint, **NO_XET},  # the Hub's address has no flag
        volumes={workspace: "/workspace"},
    )
    assert result.code == 0, result.output
    assert_complete(workspace / "out", kind, uri)


@pytest.mark.parametrize("kind", ["dataset", "model"])
def test_env_alone_fetches_from_the_hub(images, podman_run, hub, workspace, kind):
    uri = fill_hub(hub, kind)
    env = {"STORAGE_URI": uri, "HF_ENDPOINT": hub.endpoint, "OUTPUT_PATH": f"/workspace/{kind}"}
    result = podman_run(images[kind], env={**env, **NO_XET}, volumes={workspace: "/workspace"})
    assert result.code == 0, result.output
    assert_complete(workspace / kind, kind, uri)


def test_rerun_into_a_complete_folder_transfers_nothing(images, podman_run, hub, workspace):
    uri = fill_hub(hub, "model")
    env = {"STORAGE_URI": uri, "HF_ENDPOINT": hub.endpoint, **NO_XET}
    first = podman_run(images["model"], env=env, volumes={workspace: "/workspace"})
    assert first.code == 0, first.output
    dest = workspace / "model"
    before = {p: p.stat().st_mtime_ns for p in dest.rglob("*")}
    seen = len(hub.requests)

    second = podman_run(images["model"], env=env, volumes={workspace: "/workspace"})

    assert second.code == 0, second.output
    assert "nothing to fetch" in second.output
    downloads = [r for r in hub.requests[seen:] if r.server == "cdn" or "/resolve/" in r.path]
    assert downloads == []
    assert {p: p.stat().st_mtime_ns for p in dest.rglob("*")} == before


def test_a_bad_uri_exits_2_with_a_one_line_termination_message(
    images, podman_run, workspace, termination_log
):
    result = podman_run(
        images["dataset"],
        *("--storage-uri", "ftp://example.invalid/data"),
        volumes={workspace: "/workspace", termination_log: "/dev/termination-log"},
    )
    assert result.code == 2, result.output
    message = termination_log.read_text()
    assert message.endswith("\n") and message.count("\n") == 1
    assert "ftp://" in message
    assert "Traceback" not in result.output


def test_a_missing_object_exits_4_with_a_one_line_termination_message(
    images, podman_run, bucket, workspace, termination_log
):
    uri = bucket.uri("no/such/prefix")
    result = podman_run(
        images["model"],
        env={"STORAGE_URI": uri, "ENDPOINT": bucket.endpoint, **S3_KEYS},
        volumes={workspace: "/workspace", termination_log: "/dev/termination-log"},
    )
    assert result.code == 4, result.output
    message = termination_log.read_text()
    assert message.endswith("\n") and message.count("\n") == 1
    assert "no/such/prefix" in message
    assert SECRET_KEY not in result.output + message
    assert not (workspace / "model" / ".initializer-manifest.json").exists()


def test_a_volume_the_user_cannot_write_exits_6_naming_the_folder(
    images, podman_run, bucket, tmp_path, termination_log
):
    readonly = owned_dir(tmp_path / "root-owned", uid=0, gid=0, mode=0o755)
    uri = fill_s3(bucket, "dataset")
    result = podman_run(
        images["dataset"],
        env={"STORAGE_URI": uri, "ENDPOINT": bucket.endpoint, **S3_KEYS},
        volumes={readonly: "/workspace", termination_log: "/dev/termination-log"},
        # As Kubernetes starts it (runAsUser): started as root, the image would make the folder
        # (tests/images/test_image_users.py).
        options=("--user", f"{IMAGE_UID}:0"),
    )
    assert result.code == 6, result.output
    assert "/workspace/dataset" in termination_log.read_text()
    assert list(readonly.iterdir()) == []

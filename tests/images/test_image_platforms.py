"""The images under the ways platforms start them.

The Kubeflow SDK's local backend (its own command, /app, env only, a per-job bridge network),
OpenShift's arbitrary UID in group 0 with an fsGroup volume, a read-only root filesystem, and
SIGTERM from the kubelet or `docker stop`.
"""

from __future__ import annotations

import os
import time

import pytest

from initializers.errors import ExitCode
from initializers.manifest import find_problems
from tests.conftest import ACCESS_KEY, SECRET_KEY, tree
from tests.images.conftest import BUILD_TIMEOUT, owned_dir, podman, wait_container
from tests.servers.hub import Fault, fail_times

pytestmark = [pytest.mark.images, pytest.mark.timeout(BUILD_TIMEOUT + 300)]

MODEL = {
    "config.json": b'{"model_type": "llama"}',
    "model.safetensors": os.urandom(1 << 20),
    "tokenizer.json": b"{}",
    "pytorch_model.bin": b"left out: the SDK sends IGNORE_PATTERNS with *.bin",
}
DATASET = {"train.jsonl": b'{"text": "a"}\n' * 1000, "nested/test.jsonl": b'{"text": "b"}\n'}
ASSETS = {"model": MODEL, "dataset": DATASET}
# What the SDK's S3 and HF model initializers always send.
SDK_MODEL_IGNORE = "*.msgpack,*.h5,*.bin,*.pt,*.pth"
S3_KEYS = {"ACCESS_KEY_ID": ACCESS_KEY, "SECRET_ACCESS_KEY": SECRET_KEY}
OPENSHIFT_UID = 1000650000  # no passwd entry in the image
FS_GROUP = 2000


def test_sdk_local_backend_invocation_on_a_bridge_network_fetches_both_in_parallel(
    images, start_container, bridge_s3, workspace
):
    objects = {f"{kind}/{k}": body for kind, files in ASSETS.items() for k, body in files.items()}
    bucket = bridge_s3.bucket(f"sdk-{os.getpid()}", objects)
    extra = {"model": {"IGNORE_PATTERNS": SDK_MODEL_IGNORE}, "dataset": {}}
    names = {
        kind: start_container(
            images[kind],
            *("bash", "-c", f"python -m pkg.initializers.{kind}"),
            network=bridge_s3.network,
            env={
                "STORAGE_URI": f"s3://{bucket}/{kind}",
                "OUTPUT_PATH": f"/workspace/{kind}",
                "ENDPOINT": bridge_s3.endpoint,
                **S3_KEYS,
                **extra[kind],
            },
            volumes={workspace: "/workspace"},
            options=("--workdir", "/app"),
        )
        for kind in ("dataset", "model")
    }

    results = {kind: wait_container(name) for kind, name in names.items()}

    for kind, result in results.items():
        assert result.code == 0, f"{kind}: {result.output}"
    assert tree(workspace / "dataset") == DATASET
    assert tree(workspace / "model") == {k: v for k, v in MODEL.items() if k != "pytorch_model.bin"}
    assert find_problems(workspace / "dataset") == find_problems(workspace / "model") == []


def test_arbitrary_uid_in_group_zero_writes_through_an_fsgroup_volume(
    images, podman_run, bucket, tmp_path
):
    # Owned by another UID; only the (setgid) group may enter and write, as with fsGroup.
    volume = owned_dir(tmp_path / "pvc", uid=4242, gid=FS_GROUP, mode=0o2770)
    for key, body in DATASET.items():
        bucket.put(f"ds/{key}", body)
    result = podman_run(
        images["dataset"],
        env={"STORAGE_URI": bucket.uri("ds"), "ENDPOINT": bucket.endpoint, **S3_KEYS},
        volumes={volume: "/workspace"},
        options=("--user", f"{OPENSHIFT_UID}:0", "--group-add", str(FS_GROUP)),
    )
    assert result.code == 0, result.output
    assert tree(volume / "dataset") == DATASET
    written = list((volume / "dataset").rglob("*"))
    assert {p.stat().st_uid for p in written} == {OPENSHIFT_UID}
    assert {p.stat().st_gid for p in written} == {FS_GROUP}


READ_ONLY_ROOT = ("--read-only", "--read-only-tmpfs=false")  # no tmpfs on /tmp either


def test_read_only_root_puts_home_and_temp_on_the_volume(images, podman_run, workspace):
    probe = 'touch "$HOME/probe" "$TMPDIR/probe" && echo "$HOME $TMPDIR"'
    result = podman_run(
        images["model"],
        *("sh", "-c", probe),
        volumes={workspace: "/workspace"},
        options=READ_ONLY_ROOT,
    )
    assert result.code == 0, result.output
    assert result.stdout.split() == ["/workspace/.home", "/workspace/.home"]


def test_read_only_root_with_only_the_volume_writable_fetches_from_the_hub(
    images, podman_run, hub, workspace
):
    hub.add_repo("org/llama", MODEL)
    result = podman_run(
        images["model"],
        env={"STORAGE_URI": "hf://org/llama", "HF_ENDPOINT": hub.endpoint},
        volumes={workspace: "/workspace"},
        options=READ_ONLY_ROOT,
    )
    assert result.code == 0, result.output
    assert set(tree(workspace / "model")) == {"config.json", "model.safetensors", "tokenizer.json"}


def test_sigterm_stops_a_download_cleanly_and_the_rerun_resumes_it(
    images, start_container, podman_run, hub, workspace
):
    weights = os.urandom(20 << 20)  # resumable: over the engine's 8 MiB journal checkpoint
    hub.add_repo("org/big", {"config.json": b"{}", "model.safetensors": weights})
    # The CDN sends 12 MiB of the weights, then stalls: SIGTERM lands mid-download.
    hub.fault = fail_times(1, Fault.truncate(12 << 20, stall=3), server="cdn", method="GET")
    env = {"STORAGE_URI": "hf://org/big", "HF_ENDPOINT": hub.endpoint, "HF_HUB_DISABLE_XET": "1"}
    name = start_container(images["model"], env=env, volumes={workspace: "/workspace"})
    deadline = time.monotonic() + 60
    while not any(r.server == "cdn" and r.method == "GET" for r in hub.requests):
        assert time.monotonic() < deadline, "the download never started"
        time.sleep(0.1)
    time.sleep(1)

    podman("kill", "--signal", "TERM", name)
    sent = time.monotonic()
    stopped = wait_container(name, timeout=60)

    assert stopped.code == ExitCode.INTERRUPTED, stopped.output
    assert time.monotonic() - sent < 15
    assert find_problems(workspace / "model") != []  # not marked complete
    seen = len(hub.requests)

    rerun = podman_run(images["model"], env=env, volumes={workspace: "/workspace"})

    assert rerun.code == 0, rerun.output
    assert (workspace / "model" / "model.safetensors").read_bytes() == weights
    ranges = [r.range for r in hub.requests[seen:] if r.server == "cdn" and r.method == "GET"]
    assert ranges and all(r and not r.startswith("bytes=0-") for r in ranges), ranges

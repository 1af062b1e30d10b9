"""Who owns what the images write when docker/podman start them as root (no ``--user``).

The images' USER is 0 only so that the entrypoint can give the destination to an unprivileged
user before anything runs (images/README.md): a host folder owned by a non-root user, as the
Kubeflow SDK's local backend makes, gets files owned by that user, who can delete them; a
root-owned volume (or none) gets the destination made for the image's user 65532:0. Started as
any other user (Kubernetes, OpenShift, ``--user``) nothing changes: test_image_platforms.py and
tests/runtimes/test_podman_pods.py. The SDK itself drives the images in test_kubeflow_sdk.py.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.conftest import ACCESS_KEY, SECRET_KEY, tree
from tests.images.conftest import BUILD_TIMEOUT, IMAGE_UID, owned_dir, owners
from tests.podman import podman_env

pytestmark = [pytest.mark.images, pytest.mark.timeout(BUILD_TIMEOUT + 300)]

HOST_UID = HOST_GID = 1000  # a host user; the image has no passwd entry for it
MODEL = {
    "config.json": b'{"model_type": "llama"}',
    "model.safetensors": os.urandom(1 << 20),
    "tokenizer.json": b"{}",
}
S3_KEYS = {"ACCESS_KEY_ID": ACCESS_KEY, "SECRET_ACCESS_KEY": SECRET_KEY}
SDK_COMMAND = ("bash", "-c", "python -m pkg.initializers.model")  # the SDK's, in /app
IDENTITY = "id -u; id -g; grep -E '^(CapPrm|CapEff|NoNewPrivs):' /proc/self/status | cut -f2"


def fill(bucket) -> dict[str, str]:
    for key, body in MODEL.items():
        bucket.put(f"llama/{key}", body)
    return {"STORAGE_URI": bucket.uri("llama"), "ENDPOINT": bucket.endpoint, **S3_KEYS}


def test_a_host_users_folder_gets_files_that_user_owns_and_can_delete(
    images, podman_run, bucket, open_tmp
):
    job = owned_dir(open_tmp / "job", uid=HOST_UID, gid=HOST_GID, mode=0o755)  # as the SDK makes it
    result = podman_run(
        images["model"],
        *SDK_COMMAND,
        env={**fill(bucket), "OUTPUT_PATH": "/workspace/model"},
        volumes={job: "/workspace"},
        options=("--workdir", "/app"),
    )

    assert result.code == 0, result.output
    model = job / "model"
    assert tree(model) == MODEL
    assert (model / ".initializer-manifest.json").is_file()
    assert owners(model) == {(HOST_UID, HOST_GID)}
    assert sorted(os.listdir(job)) == ["model"], "HOME went to the container's /tmp, not here"
    assert (job.stat().st_uid, job.stat().st_mode & 0o7777) == (HOST_UID, 0o755), "left alone"
    # That user removes it all without privileges, as the SDK's delete_job does.
    rm = subprocess.run(
        ["rm", "-rf", "--", str(model)],
        user=HOST_UID,
        group=HOST_GID,
        extra_groups=[],
        capture_output=True,
        text=True,
        check=False,
    )
    assert rm.returncode == 0, rm.stderr
    assert not model.exists()


def test_leftovers_of_a_root_run_are_handed_over_inside_the_destination_only(
    images, podman_run, bucket, open_tmp
):
    job = owned_dir(open_tmp / "job", uid=HOST_UID, gid=HOST_GID, mode=0o755)
    model = job / "model"  # what an earlier run as root (upstream's images) left, root-owned
    (model / "old").mkdir(parents=True)
    (model / "old" / "weights.bin").write_bytes(b"old")
    (model / "stale.json").write_bytes(b"{}")
    os.chown(model / "stale.json", IMAGE_UID, 0)  # and one of an earlier run as 65532
    outside = owned_dir(job / "notes", uid=0, gid=0, mode=0o755)
    (outside / "root.txt").write_bytes(b"not the initializer's")
    (model / "link").symlink_to("../notes/root.txt")  # resolves inside the container too

    result = podman_run(images["model"], env=fill(bucket), volumes={job: "/workspace"})

    assert result.code == 0, result.output
    kept = {"old/weights.bin": b"old", "stale.json": b"{}", "link": b"not the initializer's"}
    assert tree(model) == {**MODEL, **kept}, "files that are not the initializer's stay"
    assert owners(model) == {(HOST_UID, HOST_GID)}, "the symlink itself too"
    assert owners(outside) == {(0, 0)}, "nothing outside the destination, not through a symlink"


def test_a_root_owned_volume_gets_the_destination_made_for_the_image_user(
    images, podman_run, bucket, tmp_path
):
    volume = owned_dir(tmp_path / "volume", uid=0, gid=0, mode=0o755)
    s3 = fill(bucket)
    result = podman_run(
        images["model"],
        *("--storage-uri", s3["STORAGE_URI"], "--endpoint", s3["ENDPOINT"]),
        "--output=/workspace/custom/llama",
        env=S3_KEYS,
        volumes={volume: "/workspace"},
    )

    assert result.code == 0, result.output
    assert tree(volume / "custom" / "llama") == MODEL
    assert owners(volume / "custom") == {(IMAGE_UID, 0)}
    assert os.listdir(volume) == ["custom"], "only the destination (not /workspace/model)"
    assert (volume.stat().st_uid, volume.stat().st_mode & 0o7777) == (0, 0o755), "left alone"


def test_started_as_root_on_a_read_only_volume_it_exits_6_having_written_nothing(
    images, podman_run, bucket, tmp_path, termination_log
):
    volume = owned_dir(tmp_path / "volume", uid=0, gid=0, mode=0o755)
    result = podman_run(
        images["model"],
        env=fill(bucket),
        volumes={volume: "/workspace:ro", termination_log: "/dev/termination-log"},
    )
    assert result.code == 6, result.output
    assert "/workspace/model" in termination_log.read_text()
    assert os.listdir(volume) == []


def test_root_without_the_capabilities_to_stop_being_root_refuses_to_run(
    images, podman_run, bucket, tmp_path, termination_log
):
    volume = owned_dir(tmp_path / "volume", uid=0, gid=0, mode=0o755)
    result = podman_run(
        images["model"],
        env=fill(bucket),
        volumes={volume: "/workspace", termination_log: "/dev/termination-log"},
        options=("--cap-drop", "ALL"),
    )
    assert result.code == 2, result.output
    message = termination_log.read_text()
    assert message.count("\n") == 1 and "cannot stop being root" in message
    assert "cannot stop being root" in result.stderr
    assert os.listdir(volume) == [], "nothing fetched"


def test_when_container_root_is_a_host_user_it_keeps_that_identity_without_capabilities(
    images, podman_run, bucket, open_tmp
):
    """Rootless podman/docker: container root *is* the (unprivileged) host user. Not a real
    rootless run (the tests run as root): a container started as host UID 1000 makes a user
    namespace whose root is UID 1000 (``unshare --map-root-user``), the shape rootless podman
    gives, and starts the entrypoint in it as root."""
    job = owned_dir(open_tmp / "job", uid=HOST_UID, gid=HOST_GID, mode=0o755)
    script = f"cat /proc/self/uid_map; {IDENTITY}; exec model-initializer"
    result = podman_run(
        images["model"],
        *("unshare", "--user", "--map-root-user"),
        *("/usr/local/bin/initializer-entrypoint", "sh", "-c", script),
        env=fill(bucket),
        volumes={job: "/workspace"},
        options=("--user", f"{HOST_UID}:{HOST_GID}"),
    )

    assert result.code == 0, result.output
    inside, outside, _, uid, gid, permitted, effective, no_new_privs = result.stdout.split()[:8]
    assert (inside, outside, uid, gid) == ("0", str(HOST_UID), "0", "0")
    assert int(permitted, 16) == int(effective, 16) == 0
    assert no_new_privs == "1"
    assert tree(job / "model") == MODEL
    assert owners(job / "model") == {(HOST_UID, HOST_GID)}


@pytest.mark.parametrize("kind", ["dataset", "model"])
def test_the_nonroot_variant_is_the_same_image_started_as_its_own_user(kind, images):
    """For a cluster that admits only images whose USER is non-root (runAsNonRoot without
    runAsUser): the same layers, the same entrypoint, USER 65532:0."""
    inspected = {}
    for name in (images[kind], images[f"{kind}-nonroot"]):
        proc = subprocess.run(
            ["podman", "image", "inspect", name], capture_output=True, text=True, check=True,
            env=podman_env(),
        )  # fmt: skip
        [inspected[name]] = json.loads(proc.stdout)
    root, nonroot = inspected[images[kind]], inspected[images[f"{kind}-nonroot"]]
    assert root["Config"]["User"] == "0:0"
    assert nonroot["Config"]["User"] == f"{IMAGE_UID}:0"
    assert nonroot["RootFS"]["Layers"] == root["RootFS"]["Layers"]
    assert nonroot["Config"]["Entrypoint"] == root["Config"]["Entrypoint"]


def test_the_nonroot_variant_fetches_as_65532_into_a_volume_its_group_may_write(
    images, podman_run, bucket, open_tmp
):
    """What fsGroup (or a group-0 writable volume, as OpenShift gives) provides: the files are
    the image user's, written without ever being root."""
    volume = owned_dir(open_tmp / "volume", uid=0, gid=0, mode=0o775)
    result = podman_run(
        images["model-nonroot"],
        "sh",
        "-c",
        f"{IDENTITY} && exec model-initializer",
        env={**fill(bucket), "OUTPUT_PATH": "/workspace/model"},
        volumes={volume: "/workspace"},
    )
    assert result.code == 0, result.output
    uid, gid, *caps = result.stdout.split()
    assert (int(uid), int(gid)) == (IMAGE_UID, 0)
    assert set(caps[:2]) == {"0000000000000000"}, "no capabilities at all"
    assert tree(volume / "model") == MODEL
    assert owners(volume / "model") == {(IMAGE_UID, 0)}

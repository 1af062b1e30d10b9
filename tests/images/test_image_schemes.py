"""The images carry what every scheme needs: gs:// against fake-gcs-server, az:// against
Azurite, an https:// archive, and file:// from a mounted folder, each configured by env alone
as the controller runs them, into a bind-mounted /workspace (host networking)."""

from __future__ import annotations

import io
import os
import tarfile

import pytest

from initializers.manifest import find_problems
from tests.conftest import tree
from tests.images.conftest import BUILD_TIMEOUT, IMAGE_UID

pytestmark = [pytest.mark.images, pytest.mark.timeout(BUILD_TIMEOUT + 300)]

MODEL = {
    "config.json": b'{"model_type": "llama"}',
    "model.safetensors": os.urandom(3 << 20),
    "tokenizer/tokenizer.json": b'{"version": "1.0"}',
}


def assert_complete(dest) -> None:
    assert tree(dest) == MODEL
    assert find_problems(dest) == []
    assert all(p.stat().st_uid == IMAGE_UID for p in dest.rglob("*")), "written as non-root"


def test_gs_from_the_emulator(images, podman_run, gcs_emulator, gcs_bucket, workspace):
    for name, body in MODEL.items():
        gcs_emulator.put(gcs_bucket, f"llama/{name}", body)
    env = {"STORAGE_URI": f"gs://{gcs_bucket}/llama", "STORAGE_EMULATOR_HOST": gcs_emulator.url}
    result = podman_run(images["model"], env=env, volumes={workspace: "/workspace"})
    assert result.code == 0, result.output
    assert_complete(workspace / "model")


def test_az_from_azurite(images, podman_run, azurite, container_name, workspace):
    azurite.create_container(container_name)
    for name, body in MODEL.items():
        azurite.put(container_name, f"llama/{name}", body)
    env = {
        "STORAGE_URI": f"az://{container_name}/llama",
        "AZURE_STORAGE_CONNECTION_STRING": azurite.connection_string(),
    }
    result = podman_run(images["model"], env=env, volumes={workspace: "/workspace"})
    assert result.code == 0, result.output
    assert_complete(workspace / "model")


def test_an_https_archive_is_unpacked(images, podman_run, web, workspace):
    packed = io.BytesIO()
    with tarfile.open(fileobj=packed, mode="w:gz") as archive:
        for name, body in MODEL.items():
            info = tarfile.TarInfo(name)
            info.size = len(body)
            archive.addfile(info, io.BytesIO(body))
    url = web.put("/releases/llama.tar.gz", packed.getvalue())
    result = podman_run(
        images["model"], env={"STORAGE_URI": url}, volumes={workspace: "/workspace"}
    )
    assert result.code == 0, result.output
    assert_complete(workspace / "model")


def test_file_from_a_mounted_volume(images, podman_run, tmp_path, workspace):
    source = tmp_path / "pvc"
    for name, body in MODEL.items():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_bytes(body)
    for path in [source, *source.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)  # readable by the image's user
    tmp_path.chmod(0o755)
    result = podman_run(
        images["model"],
        env={"STORAGE_URI": "file:///mnt/pvc"},
        volumes={workspace: "/workspace", source: "/mnt/pvc"},
    )
    assert result.code == 0, result.output
    assert_complete(workspace / "model")

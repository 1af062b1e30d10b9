"""The images carry what every scheme needs: gs:// against fake-gcs-server, az:// against
Azurite, an https:// archive, file:// from a mounted folder, and oci:// from a real registry (an
ORAS artifact, a tar+zstd modelcar), each configured by env alone as the controller runs them,
into a bind-mounted /workspace (host networking)."""

from __future__ import annotations

import io
import os
import tarfile

import pytest

from initializers.manifest import find_problems
from tests.conftest import tree
from tests.images.conftest import BUILD_TIMEOUT, IMAGE_UID
from tests.servers.registry import compressed, tar_bytes, write_layout

ZSTD_LAYER = "application/vnd.oci.image.layer.v1.tar+zstd"

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


def test_oci_files_and_a_zstd_modelcar_from_a_registry(
    images, podman_run, registry, tmp_path, workspace
):
    source = tmp_path / "artifact"
    for name, body in MODEL.items():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_bytes(body)
    registry.push_files("images/llama:v1", source, list(MODEL))
    env = {"STORAGE_URI": f"oci://{registry.ref('images/llama:v1')}"}
    env["OCI_INSECURE_REGISTRIES"] = registry.host
    result = podman_run(images["model"], env=env, volumes={workspace: "/workspace"})
    assert result.code == 0, result.output
    assert_complete(workspace / "model")

    layout = tmp_path / "modelcar"
    members = {f"models/{name}": body for name, body in MODEL.items()}
    write_layout(
        layout,
        [compressed(tar_bytes(dict(members)), ZSTD_LAYER)],
        layer_media_type=ZSTD_LAYER,
    )
    registry.push_layout(layout, "images/modelcar:v1")
    env["STORAGE_URI"] = f"oci://{registry.ref('images/modelcar:v1')}"
    result = podman_run(images["dataset"], env=env, volumes={workspace: "/workspace"})
    assert result.code == 0, result.output
    assert tree(workspace / "dataset") == MODEL

"""oci:// against a real registry (Distribution, Debian's docker-registry) on 127.0.0.1, filled
with real clients: the oras client pushes files and folders, skopeo pushes image layouts
(modelcars with whiteouts, a multi-platform index, ModelPack-style artifacts)."""

from __future__ import annotations

import base64
import hashlib
import json
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from initializers.manifest import read_manifest
from tests.conftest import tree
from tests.servers.registry import Registry, compressed, tar_bytes, write_layout

RNG = random.Random(37)
MIB = 1 << 20
WEIGHTS = RNG.randbytes(3 * MIB + 17)
MODEL = {
    "config.json": b'{"model_type": "llama"}',
    "model.safetensors": WEIGHTS,
    "tokenizer/tokenizer.json": RNG.randbytes(50_000),
}
TITLE = "org.opencontainers.image.title"
GZIP_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("model")
    for name, body in MODEL.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(body)
    return folder


def fetch(run_initializer, registry: Registry, target: str, out: Path, *args: str, **env: str):
    """The model initializer on ``target``, the registry named as plain http."""
    insecure = {"OCI_INSECURE_REGISTRIES": registry.host, **env}
    return initialize(run_initializer, registry, target, out, *args, env=insecure)


def initialize(run_initializer, registry: Registry, target: str, out: Path, *args: str, env=None):
    uri = f"oci://{registry.ref(target)}"
    return run_initializer("model", "--storage-uri", uri, "--output", str(out), *args, env=env)


def fetch_as_user(run_initializer, registry: Registry, target: str, out: Path):
    """``fetch`` with the registry's one account as OCI_USERNAME and OCI_PASSWORD."""
    login = {"OCI_USERNAME": registry.username, "OCI_PASSWORD": registry.password}
    return fetch(run_initializer, registry, target, out, **login)


def push_modelcar(registry: Registry, tmp_path: Path, target: str, layers: list[bytes]) -> str:
    layout = tmp_path / f"layout-{target.replace(':', '-').replace('/', '-')}"
    gzipped = [compressed(layer, GZIP_LAYER) for layer in layers]
    write_layout(layout, gzipped, layer_media_type=GZIP_LAYER)
    return registry.push_layout(layout, target)


def test_files_pushed_with_oras_arrive_verified_and_a_rerun_fetches_nothing(
    registry, model_folder, run_initializer, tmp_path
):
    digest = registry.push_files("models/files:v1", model_folder, list(MODEL))
    out = tmp_path / "out"
    first = fetch(run_initializer, registry, "models/files:v1", out)
    assert first.code == 0, first.output
    assert tree(out) == MODEL
    recorded = read_manifest(out)
    assert recorded is not None and recorded.revision == digest
    again = fetch(run_initializer, registry, "models/files:v1", out)
    assert again.code == 0 and "nothing to fetch" in again.output


def test_a_folder_pushed_as_a_tar_is_unpacked_beside_the_files(
    registry, model_folder, run_initializer, tmp_path
):
    registry.push_files("models/folder:v1", model_folder, ["config.json", "tokenizer"])
    out = tmp_path / "out"
    result = fetch(run_initializer, registry, "models/folder:v1", out)
    assert result.code == 0, result.output
    assert tree(out) == {k: v for k, v in MODEL.items() if k != "model.safetensors"}


def test_a_sub_path_and_a_digest_pin_select_what_is_fetched(
    registry, model_folder, run_initializer, tmp_path
):
    digest = registry.push_files("models/pinned:v1", model_folder, list(MODEL))
    out = tmp_path / "out"
    result = fetch(run_initializer, registry, f"models/pinned@{digest}/tokenizer", out)
    assert result.code == 0, result.output
    assert tree(out) == {"tokenizer.json": MODEL["tokenizer/tokenizer.json"]}


def test_a_tag_pushed_again_fetches_only_the_changed_file(
    registry, model_folder, run_initializer, tmp_path
):
    registry.push_files("models/moving:v1", model_folder, list(MODEL))
    out = tmp_path / "out"
    assert fetch(run_initializer, registry, "models/moving:v1", out).code == 0
    changed = tmp_path / "changed"
    changed.mkdir()
    (changed / "config.json").write_bytes(b'{"model_type": "mistral"}')
    (changed / "model.safetensors").write_bytes(WEIGHTS)
    registry.push_files("models/moving:v1", changed, ["config.json", "model.safetensors"])
    result = fetch(run_initializer, registry, "models/moving:v1", out)
    assert result.code == 0, result.output
    assert tree(out) == {"config.json": b'{"model_type": "mistral"}', "model.safetensors": WEIGHTS}
    assert "1 fetched" in result.output  # the weights' digest did not change


def test_a_modelcar_image_keeps_its_models_folder_with_whiteouts_applied(
    registry, run_initializer, tmp_path
):
    base = tar_bytes(
        {
            "models/": None,
            "models/model.safetensors": WEIGHTS,
            "models/old.bin": b"removed above",
            "models/cache/stale.txt": b"hidden by an opaque folder",
            "etc/labels.json": b"{}",
        }
    )
    top = tar_bytes(
        {
            "models/config.json": MODEL["config.json"],
            "models/.wh.old.bin": b"",
            "models/cache/.wh..wh..opq": b"",
            "models/cache/fresh.txt": b"fresh",
        }
    )
    push_modelcar(registry, tmp_path, "modelcars/llama:v1", [base, top])
    out = tmp_path / "out"
    result = fetch(run_initializer, registry, "modelcars/llama:v1", out)
    assert result.code == 0, result.output
    assert tree(out) == {
        "model.safetensors": WEIGHTS,
        "config.json": MODEL["config.json"],
        "cache/fresh.txt": b"fresh",
    }
    other = tmp_path / "etc"
    result = fetch(run_initializer, registry, "modelcars/llama:v1/etc", other)
    assert result.code == 0, result.output
    assert tree(other) == {"labels.json": b"{}"}


def test_an_index_gives_the_platform_asked_for_and_names_the_others_when_missing(
    registry, run_initializer, tmp_path
):
    layout = tmp_path / "multi"
    write_layout(
        layout,
        [tar_bytes({"models/w.bin": b"weights"})],
        platforms=["linux/amd64", "linux/arm64"],
    )
    registry.push_layout(layout, "modelcars/multi:v1", all_platforms=True)
    amd = tmp_path / "amd"
    assert fetch(run_initializer, registry, "modelcars/multi:v1", amd).code == 0
    assert (amd / "platform.txt").read_text() == "linux/amd64"
    arm = tmp_path / "arm"
    result = fetch(
        run_initializer, registry, "modelcars/multi:v1", arm, "--platform", "linux/arm64"
    )
    assert result.code == 0, result.output
    assert (arm / "platform.txt").read_text() == "linux/arm64"
    missing = fetch(
        run_initializer,
        registry,
        "modelcars/multi:v1",
        tmp_path / "s390x",
        "--platform",
        "linux/s390x",
    )
    assert missing.code == 4
    assert "linux/amd64, linux/arm64" in missing.stderr


def test_modelpack_raw_layers_land_at_their_file_paths(registry, run_initializer, tmp_path):
    layout = tmp_path / "modelpack"
    write_layout(
        layout,
        [WEIGHTS, MODEL["config.json"]],
        layer_media_type="application/vnd.cncf.model.weight.v1.raw",
        config_media_type="application/vnd.cncf.model.config.v1+json",
        annotations=[
            {"org.cncf.model.filepath": "weights/model.safetensors"},
            {"org.cncf.model.filepath": "config.json"},
        ],
        artifact_type="application/vnd.cncf.model.manifest.v1+json",
    )
    registry.push_layout(layout, "modelpack/llama:v1")
    out = tmp_path / "out"
    result = fetch(run_initializer, registry, "modelpack/llama:v1", out)
    assert result.code == 0, result.output
    assert tree(out) == {"weights/model.safetensors": WEIGHTS, "config.json": MODEL["config.json"]}


def test_an_unknown_artifact_type_exits_2_naming_its_media_types(
    registry, run_initializer, tmp_path
):
    layout = tmp_path / "odd"
    write_layout(
        layout,
        [b"opaque"],
        layer_media_type="application/vnd.example.thing",
        config_media_type="application/vnd.example.config+json",
    )
    registry.push_layout(layout, "odd/thing:v1")
    result = fetch(run_initializer, registry, "odd/thing:v1", tmp_path / "out")
    assert result.code == 2
    assert "application/vnd.example.thing" in result.stderr
    assert "Traceback" not in result.output


def test_a_missing_tag_exits_4(registry, model_folder, run_initializer, tmp_path):
    registry.push_files("models/tagged:v1", model_folder, ["config.json"])
    result = fetch(run_initializer, registry, "models/tagged:v9", tmp_path / "out")
    assert result.code == 4
    assert "v9 is not in" in result.stderr


def test_a_blob_whose_bytes_do_not_match_its_digest_exits_5_with_nothing_under_its_name(
    registry, run_initializer, tmp_path
):
    folder = tmp_path / "src"
    folder.mkdir()
    body = RNG.randbytes(MIB)
    (folder / "weights.bin").write_bytes(body)
    registry.push_files("models/corrupt:v1", folder, ["weights.bin"])
    digest = "sha256:" + hashlib.sha256(body).hexdigest()
    registry.put_blob_bytes("models/corrupt", digest, bytes(len(body)))
    out = tmp_path / "out"
    result = fetch(run_initializer, registry, "models/corrupt:v1", out)
    assert result.code == 5, result.output
    assert not (out / "weights.bin").exists()


def test_a_hostile_tar_layer_writes_nothing_outside_the_destination(
    registry, run_initializer, tmp_path
):
    hostile = tar_bytes(
        {"models/../../escape.txt": b"x", "models/ok.txt": b"ok"},
        symlinks={"models/passwd": "/etc/passwd"},
    )
    push_modelcar(registry, tmp_path, "modelcars/hostile:v1", [hostile])
    out = tmp_path / "deep" / "out"
    result = fetch(run_initializer, registry, "modelcars/hostile:v1", out)
    assert result.code == 0, result.output
    assert tree(out) == {"ok.txt": b"ok"}
    assert (
        not (tmp_path / "escape.txt").exists() and not (tmp_path / "deep" / "escape.txt").exists()
    )


def test_a_dry_run_lists_the_files_and_writes_nothing(
    registry, model_folder, run_initializer, tmp_path
):
    registry.push_files("models/dry:v1", model_folder, list(MODEL))
    out = tmp_path / "out"
    result = fetch(run_initializer, registry, "models/dry:v1", out, "--dry-run")
    assert result.code == 0, result.output
    assert "model.safetensors" in result.stdout
    assert not out.exists()


# -- credentials ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def basic_registry(registry, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """Basic auth over TLS (after ``registry``: its tools, checked the same way)."""
    with Registry(tmp_path_factory.mktemp("basic"), auth="basic", tls=True) as server:
        yield server


@pytest.fixture(scope="module")
def token_registry(registry, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """Distribution's token auth, its token endpoint run by the fixture."""
    with Registry(tmp_path_factory.mktemp("token"), auth="token") as server:
        yield server


def docker_config(registry: Registry, password: str | None = None) -> str:
    pair = f"{registry.username}:{password or registry.password}".encode()
    return json.dumps({"auths": {registry.host: {"auth": base64.b64encode(pair).decode()}}})


def secure_fetch(run_initializer, registry: Registry, target: str, out: Path, **env: str):
    """The model initializer on ``target`` over TLS, trusting the registry's CA."""
    ca = ("--ca-bundle", str(registry.ca_file))
    return initialize(run_initializer, registry, target, out, *ca, env=env)


def test_basic_auth_over_tls_takes_credentials_from_env_a_pull_secret_or_an_auth_file(
    basic_registry, model_folder, run_initializer, tmp_path
):
    basic_registry.push_files("private/model:v1", model_folder, ["config.json"])
    registry, target = basic_registry, "private/model:v1"
    pair = {"OCI_USERNAME": registry.username, "OCI_PASSWORD": registry.password}
    assert secure_fetch(run_initializer, registry, target, tmp_path / "a", **pair).code == 0
    secret = {"OCI_DOCKERCONFIGJSON": docker_config(registry)}
    assert secure_fetch(run_initializer, registry, target, tmp_path / "b", **secret).code == 0
    auth_file = tmp_path / "auth.json"
    auth_file.write_text(docker_config(registry))
    by_file = {"REGISTRY_AUTH_FILE": str(auth_file)}
    assert secure_fetch(run_initializer, registry, target, tmp_path / "c", **by_file).code == 0
    assert tree(tmp_path / "c") == {"config.json": MODEL["config.json"]}


def test_wrong_or_missing_credentials_exit_3_without_the_password(
    basic_registry, model_folder, run_initializer, tmp_path
):
    basic_registry.push_files("private/refused:v1", model_folder, ["config.json"])
    wrong = secure_fetch(
        run_initializer,
        basic_registry,
        "private/refused:v1",
        tmp_path / "a",
        OCI_USERNAME=basic_registry.username,
        OCI_PASSWORD="not-the-password",
    )
    assert wrong.code == 3
    assert "refused the credentials" in wrong.stderr and "not-the-password" not in wrong.output
    anonymous = secure_fetch(run_initializer, basic_registry, "private/refused:v1", tmp_path / "b")
    assert anonymous.code == 3
    assert "OCI_USERNAME" in anonymous.stderr


def test_without_the_registry_ca_tls_is_refused_with_the_fix(
    basic_registry, run_initializer, tmp_path
):
    result = initialize(run_initializer, basic_registry, "private/model:v1", tmp_path / "out")
    assert result.code == 2
    assert "--ca-bundle" in result.stderr and "OCI_INSECURE_REGISTRIES" in result.stderr


def test_a_token_registry_is_answered_with_a_pull_token_for_the_repository(
    token_registry, model_folder, run_initializer, tmp_path
):
    token_registry.push_files("private/tokened:v1", model_folder, list(MODEL))
    token_registry.token_requests.clear()
    out = tmp_path / "out"
    result = fetch_as_user(run_initializer, token_registry, "private/tokened:v1", out)
    assert result.code == 0, result.output
    assert tree(out) == MODEL
    scopes = {request.get("scope") for request in token_registry.token_requests}
    assert scopes == {"repository:private/tokened:pull"}
    anonymous = fetch(run_initializer, token_registry, "private/tokened:v1", tmp_path / "anon")
    assert anonymous.code == 3


def test_a_public_repository_behind_token_auth_is_read_with_an_anonymous_token(
    token_registry, model_folder, run_initializer, tmp_path
):
    token_registry.push_files("public/model:v1", model_folder, ["config.json"])
    token_registry.public = True  # as Docker Hub gives anonymous pull tokens
    try:
        token_registry.token_requests.clear()
        result = fetch(run_initializer, token_registry, "public/model:v1", tmp_path / "out")
    finally:
        token_registry.public = False
    assert result.code == 0, result.output
    assert tree(tmp_path / "out") == {"config.json": MODEL["config.json"]}
    assert [r.get("scope") for r in token_registry.token_requests] == [
        "repository:public/model:pull"
    ]


def test_blob_redirects_to_object_storage_are_followed_without_the_registry_credentials(
    registry, web, model_folder, run_initializer, tmp_path
):
    with Registry(tmp_path / "redirecting", auth="basic", blob_redirect=web.url) as redirecting:
        redirecting.push_files("private/redirected:v1", model_folder, list(MODEL))
        for body in MODEL.values():  # the "object storage" behind the redirects
            digest = f"sha256:{hashlib.sha256(body).hexdigest()}"
            stored = redirecting.blob_file("private/redirected", digest)
            web.put("/" + str(stored.relative_to(redirecting.storage)), body)
        out = tmp_path / "out"
        result = fetch_as_user(run_initializer, redirecting, "private/redirected:v1", out)
    assert result.code == 0, result.output
    assert tree(out) == MODEL
    blob_gets = [headers for method, _, headers in web.requests if method == "GET"]
    assert blob_gets, "no blob was fetched from the redirect's target"
    assert not any("authorization" in {k.lower() for k in headers} for headers in blob_gets)

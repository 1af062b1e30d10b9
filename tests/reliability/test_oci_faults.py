"""oci:// under a bad network and kills: random faults between the initializer and a real
registry leave a byte-identical tree; a blob cut by a kill resumes from its journal; a SIGTERM
mid-blob stops at once with nothing under a final name."""

from __future__ import annotations

import time
from pathlib import Path

from initializers.manifest import find_problems
from tests.reliability.conftest import assert_identical, dataset, stop_with_sigterm
from tests.servers.faultproxy import every_fault
from tests.servers.registry import Registry, compressed, tar_bytes, write_layout

GZIP_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"

MIB = 1 << 20


def push(registry: Registry, tmp_path: Path, target: str, files: dict[str, bytes]) -> None:
    folder = tmp_path / f"push-{target.replace('/', '-').replace(':', '-')}"
    for name, body in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(body)
    registry.push_files(target, folder, sorted(files))


def args(host: str, target: str, out: Path) -> tuple[str, ...]:
    return ("--storage-uri", f"oci://{host}/{target}", "--output", str(out))


def test_random_faults_between_the_initializer_and_a_registry_leave_a_byte_identical_tree(
    registry, proxies, run_initializer, tmp_path
):
    files = dataset(61, {"model.safetensors": 48 * MIB, "config.json": 900, "vocab.json": 70_000})
    push(registry, tmp_path, "faults/files:v1", files)
    members = dataset(62, {f"models/part-{i}.json": 30_000 + i for i in range(6)})
    layout = tmp_path / "modelcar"
    write_layout(
        layout,
        [compressed(tar_bytes(dict(members)), GZIP_LAYER)],
        layer_media_type=GZIP_LAYER,
    )
    registry.push_layout(layout, "faults/modelcar:v1")
    proxy = proxies(registry.url, seed=63, share=0.35, faults=every_fault(stall_seconds=30))
    host = proxy.url.removeprefix("http://")
    expected_modelcar = {name.removeprefix("models/"): body for name, body in members.items()}
    for target, expected, out in (
        ("faults/files:v1", files, tmp_path / "files"),
        ("faults/modelcar:v1", expected_modelcar, tmp_path / "modelcar-out"),
    ):
        env = {"OCI_INSECURE_REGISTRIES": host, "TIMEOUT": "1"}
        result = run_initializer("model", *args(host, target, out), env=env)
        assert result.code == 0, result.output
        assert_identical(out, expected)
        assert find_problems(out) == []
    assert proxy.total_injected > 0


def test_a_blob_cut_by_a_kill_resumes_from_its_journal(
    registry, proxies, launch, run_initializer, tmp_path
):
    files = dataset(64, {"model.safetensors": 96 * MIB})
    push(registry, tmp_path, "kills/model:v1", files)
    slow = proxies(registry.url, rate=12 * MIB)  # per connection: the fetch takes seconds
    host = slow.url.removeprefix("http://")
    out = tmp_path / "model"
    env = {"OCI_INSECURE_REGISTRIES": host}
    live = launch("model", *args(host, "kills/model:v1", out), env=env)
    live.wait_for("fetching 1 of 1 files")
    while slow.body_bytes < 24 * MIB:
        live.proc.poll()
        assert live.proc.returncode is None, live.stderr
        time.sleep(0.05)
    live.kill()
    assert (out / ".model.safetensors.part.journal").exists()
    served_before = slow.body_bytes
    rerun = run_initializer("model", *args(host, "kills/model:v1", out), env=env)
    assert rerun.code == 0, rerun.output
    assert "resuming" in rerun.stderr, rerun.stderr
    assert_identical(out, files)
    assert slow.body_bytes - served_before < 96 * MIB - 8 * MIB  # kept bytes not fetched again


def test_a_sigterm_mid_blob_stops_at_once_and_leaves_nothing_under_its_name(
    registry, proxies, launch, tmp_path
):
    files = dataset(65, {"model.safetensors": 64 * MIB})
    push(registry, tmp_path, "kills/stopped:v1", files)
    slow = proxies(registry.url, rate=4 * MIB)
    host = slow.url.removeprefix("http://")
    out = tmp_path / "model"
    live = launch(
        "model", *args(host, "kills/stopped:v1", out), env={"OCI_INSECURE_REGISTRIES": host}
    )
    live.wait_for("fetching 1 of 1 files")
    while slow.body_bytes < 4 * MIB:
        time.sleep(0.05)
    stop_with_sigterm(live, out / "model.safetensors", within=5)


def test_a_token_that_expires_mid_fetch_is_renewed_and_the_fetch_completes(
    registry, proxies, run_initializer, tmp_path
):
    files = dataset(66, {f"model-0000{i}.safetensors": 12 * MIB for i in range(1, 4)})
    with Registry(tmp_path / "token", auth="token") as tokened:
        push(tokened, tmp_path, "private/expiring:v1", files)
        tokened.token_requests.clear()
        # Distribution accepts a token up to 60 s past its expiry: this one ends 2 s after it
        # is issued, and the fetch through the slow proxy takes a few seconds
        tokened.token_lifetime = -58
        slow = proxies(tokened.url, rate=8 * MIB)
        host = slow.url.removeprefix("http://")
        out = tmp_path / "model"
        env = {
            "OCI_INSECURE_REGISTRIES": host,
            "OCI_USERNAME": tokened.username,
            "OCI_PASSWORD": tokened.password,
            "WORKERS": "1",  # one blob after another: the last starts after the token expired
        }
        result = run_initializer("model", *args(host, "private/expiring:v1", out), env=env)
        assert result.code == 0, result.output
        assert_identical(out, files)
        assert len(tokened.token_requests) >= 2, result.output  # the first, and a renewal


def blob_gets(proxy) -> dict[str, int]:
    return {request: n for request, n in proxy.seen.items() if "/blobs/" in request and n}


def test_the_asset_store_reuses_an_unchanged_digest_with_no_blob_fetched_again(
    registry, proxies, run_initializer, tmp_path
):
    files = dataset(67, {"model.safetensors": 3 * MIB, "config.json": 400})
    push(registry, tmp_path, "cached/files:v1", files)
    members = dataset(68, {"models/weights.safetensors": 2 * MIB, "models/config.json": 300})
    layout = tmp_path / "cached-modelcar"
    write_layout(layout, [tar_bytes(dict(members))])
    registry.push_layout(layout, "cached/modelcar:v1")
    proxy = proxies(registry.url)
    host = proxy.url.removeprefix("http://")
    env = {"OCI_INSECURE_REGISTRIES": host, "CACHE_DIR": str(tmp_path / "cache")}
    modelcar = {name.removeprefix("models/"): body for name, body in members.items()}
    for target, expected in (("cached/files:v1", files), ("cached/modelcar:v1", modelcar)):
        first = run_initializer("model", *args(host, target, tmp_path / "a" / target), env=env)
        assert first.code == 0, first.output
        sent = proxy.body_bytes
        second = run_initializer("model", *args(host, target, tmp_path / "b" / target), env=env)
        assert second.code == 0, second.output
        assert "already complete" in second.stderr
        # the manifest again and the first byte of a blob (the caller proves it may read the
        # source before it is linked to the entry), no blob's bytes
        assert proxy.body_bytes - sent < 8192
        assert_identical(tmp_path / "b" / target, expected)


def test_shards_split_an_artifact_by_blob_and_a_modelcar_is_refused_with_the_fix(
    registry, proxies, launch, run_initializer, tmp_path
):
    files = dataset(69, {f"shard-{i}.safetensors": (i + 1) * 300_000 for i in range(6)})
    push(registry, tmp_path, "sharded/files:v1", files)
    proxy = proxies(registry.url)
    host = proxy.url.removeprefix("http://")
    out = tmp_path / "shared-volume"
    runs = [
        launch(
            "model",
            *args(host, "sharded/files:v1", out),
            env={"OCI_INSECURE_REGISTRIES": host, "SHARDS": "2", "JOB_COMPLETION_INDEX": str(i)},
        )
        for i in range(2)
    ]
    assert [run.finish() for run in runs] == [0, 0], [run.stderr for run in runs]
    assert_identical(out, files)
    assert set(blob_gets(proxy).values()) == {1} and len(blob_gets(proxy)) == len(files)
    layout = tmp_path / "sharded-modelcar"
    write_layout(layout, [tar_bytes({"models/a.json": b"{}"})])
    registry.push_layout(layout, "sharded/modelcar:v1")
    refused = run_initializer(
        "model",
        *args(host, "sharded/modelcar:v1", tmp_path / "refused"),
        env={"OCI_INSECURE_REGISTRIES": host, "SHARDS": "2", "JOB_COMPLETION_INDEX": "0"},
    )
    assert refused.code == 2 and "drop SHARDS" in refused.stderr

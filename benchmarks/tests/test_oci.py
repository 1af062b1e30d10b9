"""The oci:// benchmark end to end at a tiny scale: a real registry, both layouts, all peers."""

from __future__ import annotations

import importlib.util
import json
import shutil
import tarfile
from pathlib import Path

import pytest

from benchmarks import oci
from tests.servers.registry import binary

SCALE = 0.004  # 1 MiB shards: the model's default files are about 11 MiB

missing = [tool for tool in ("skopeo", "tar") if shutil.which(tool) is None]
missing += [] if binary() else ["docker-registry"]
missing += [] if importlib.util.find_spec("oras") else ["oras (pip)"]
pytestmark = pytest.mark.skipif(bool(missing), reason=f"needs {', '.join(missing)}")


def test_one_round_of_both_layouts_runs_every_contender_and_checks_every_tree(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert oci.main(["--bench-dir", str(tmp_path), "--scale", str(SCALE), "--rounds", "1"]) == 0
    [out] = (tmp_path / "results").glob("oci-*")
    results = json.loads((out / "results.json").read_text())
    assert results["failed"] is None and results["commit"]["id"]
    assert "page_reporting_order" in results["kernel_settings"]
    runs = [(r["layout"], r["contender"], r["pair"]) for r in results["runs"]]
    # Paired: ours beside each peer (twice on the artifact), oras on the artifact only.
    assert sorted(runs) == sorted(
        [
            ("artifact", "ours", "skopeo"), ("artifact", "skopeo", "skopeo"),
            ("artifact", "ours", "oras"), ("artifact", "oras", "oras"),
            ("modelcar", "ours", "skopeo"), ("modelcar", "skopeo", "skopeo"),
        ]
    )  # fmt: skip
    assert all(r["ok"] and r["returncode"] == 0 and r["wall_s"] > 0 for r in results["runs"])
    assert all(r["peak_rss_mib"] > 0 for r in results["runs"])
    assert not (out / "runs").exists()  # every tree removed once checked
    printed = capsys.readouterr().out
    assert "| artifact | oras-py pull | 1 |" in printed
    assert "| modelcar | oras-py pull | - | not run" in printed
    assert "Goals (the issue's)" in printed and "Commit " in printed
    # A second run finds both layouts in the registry and pushes nothing again.
    assert oci.main(["--bench-dir", str(tmp_path), "--scale", str(SCALE), "--rounds", "1",
                     "--only", "ours", "--layouts", "artifact"]) == 0  # fmt: skip
    assert "pushing" not in capsys.readouterr().out
    # The saved results render again.
    assert oci.main(["--report", str(out / "results.json")]) == 0
    assert "| modelcar | skopeo copy dir: + extract | 1 |" in capsys.readouterr().out


def test_a_tree_is_checked_by_its_file_set_sizes_and_sha256(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.bin").write_bytes(b"abc")
    (tmp_path / ".initializer-manifest.json").write_text("{}")
    expected = {"sub/a.bin": (3, oci.sha256_of(tmp_path / "sub" / "a.bin"))}
    allowed = frozenset({".initializer-manifest.json"})
    assert oci.verify(tmp_path, expected, allowed) == []
    assert oci.verify(tmp_path, expected, frozenset()) == ["unexpected .initializer-manifest.json"]
    (tmp_path / "sub" / "a.bin").write_bytes(b"abd")  # same size, other bytes
    assert oci.verify(tmp_path, expected, allowed) == ["sub/a.bin: sha256 differs"]
    (tmp_path / "sub" / "a.bin").unlink()
    assert oci.verify(tmp_path, expected, allowed) == ["missing sub/a.bin"]


def test_the_layouts_are_what_the_clients_are_told(tmp_path: Path) -> None:
    """The artifact names each file twice (ModelPack's path, ORAS' title); the modelcar's one
    layer holds them under models/ with a folder entry; both layouts are streamed to disk."""
    files = {}
    for rel, content in {"config.json": b"{}", "model.safetensors": b"w" * 5000}.items():
        files[rel] = tmp_path / "src" / rel
        files[rel].parent.mkdir(exist_ok=True)
        files[rel].write_bytes(content)
    sha = {rel: oci.sha256_of(path) for rel, path in files.items()}
    oci.write_artifact(tmp_path / "artifact", files, sha)
    index = json.loads((tmp_path / "artifact" / "index.json").read_text())
    blobs = tmp_path / "artifact" / "blobs" / "sha256"
    manifest = json.loads((blobs / index["manifests"][0]["digest"][7:]).read_text())
    assert manifest["artifactType"] == oci.MODEL_ARTIFACT
    assert manifest["config"]["mediaType"] == oci.MODEL_CONFIG
    assert [(x["mediaType"], x["annotations"]) for x in manifest["layers"]] == [
        (oci.MODEL_WEIGHT_CONFIG, {oci.FILEPATH: "config.json", oci.TITLE: "config.json"}),
        (oci.MODEL_WEIGHT, {oci.FILEPATH: "model.safetensors", oci.TITLE: "model.safetensors"}),
    ]
    oci.write_modelcar(tmp_path / "modelcar", files, per_file=False)
    index = json.loads((tmp_path / "modelcar" / "index.json").read_text())
    blobs = tmp_path / "modelcar" / "blobs" / "sha256"
    manifest = json.loads((blobs / index["manifests"][0]["digest"][7:]).read_text())
    [layer] = manifest["layers"]
    assert layer["mediaType"] == oci.IMAGE_LAYER
    assert oci.sha256_of(blobs / layer["digest"][7:]) == layer["digest"][7:]
    with tarfile.open(blobs / layer["digest"][7:]) as tar:
        assert tar.getnames() == ["models", "models/config.json", "models/model.safetensors"]

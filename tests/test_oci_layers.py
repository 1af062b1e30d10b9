"""oci:// without a registry: what a reference names, what a manifest's layers are, and how an
image's layers make one tree (whiteouts, links, the kept folder), unpacked from real tars."""

from __future__ import annotations

import io
import tarfile
import threading
from pathlib import Path

import pytest
from backports import zstd

from initializers.errors import NotFoundError, UsageError
from initializers.sources.base import Layer, Layered, RemoteFile
from initializers.sources.ocilayout import classify
from initializers.sources.ociref import Reference
from initializers.unpack import unpack_layers

DIGEST = "sha256:" + "ab" * 32


def test_a_reference_names_registry_repository_tag_digest_and_sub_path():
    assert Reference.parse("reg.io:5000/org/model:v1.2/models/7b") == Reference(
        "reg.io:5000", "org/model", "v1.2", "models/7b"
    )
    assert Reference.parse(f"reg.io/org/model@{DIGEST}").reference == DIGEST
    assert Reference.parse("localhost/model").reference == "latest"
    assert Reference.parse("docker.io/ubuntu:24.04") == Reference(
        "registry-1.docker.io", "library/ubuntu", "24.04"
    )


@pytest.mark.parametrize(
    "location, says",
    [
        ("org/model:v1", "registry host"),
        ("reg.io/Org/Model:v1", "not a valid repository name"),
        ("reg.io/org/model:v1/../../etc", "sub-path"),
        ("reg.io/org/model@sha256:1234", "not a sha256 digest"),
        ("reg.io/org/model:-bad", "not a valid tag"),
    ],
)
def test_a_malformed_reference_is_refused_with_the_fix(location, says):
    with pytest.raises(UsageError, match=says):
        Reference.parse(location)


def layer(media_type: str, size: int = 3, **annotations: str) -> dict[str, object]:
    return {"mediaType": media_type, "digest": DIGEST, "size": size, "annotations": annotations}


def manifest(config: str, *layers: dict[str, object]) -> dict[str, object]:
    return {"config": {"mediaType": config}, "layers": list(layers)}


def test_oras_and_modelpack_layers_are_files_named_by_their_annotations():
    title = "org.opencontainers.image.title"
    layout = classify(
        manifest(
            "application/vnd.cncf.model.config.v1+json",
            layer(
                "application/vnd.cncf.model.weight.v1.raw", **{"org.cncf.model.filepath": "w/a.bin"}
            ),
            layer("application/vnd.oci.image.layer.v1.tar", **{title: "config.json"}),
        ),
        "oci://r/x:v1",
    )
    assert [plan.name for plan in layout.layers] == ["w/a.bin", "config.json"]
    assert layout.files_only and not layout.image


def test_tars_of_files_are_unpacked_and_an_image_keeps_its_layers_in_order():
    packaged = classify(
        manifest(
            "application/vnd.kitops.modelkit.config.v1+json",
            layer("application/vnd.kitops.modelkit.model.v1.tar+gzip"),
            layer(
                "application/vnd.oci.image.layer.v1.tar+gzip",
                **{"org.opencontainers.image.title": "docs"},
            ),
        ),
        "oci://r/x:v1",
    )
    assert [plan.name for plan in packaged.layers] == ["", ""]
    image = classify(
        manifest(
            "application/vnd.docker.container.image.v1+json",
            layer("application/vnd.docker.image.rootfs.diff.tar.gzip"),
            layer("application/vnd.oci.image.layer.v1.tar+zstd"),
        ),
        "oci://r/x:v1",
    )
    assert image.image and len(image.layers) == 2


def test_an_unknown_layout_is_refused_naming_the_media_types_found():
    with pytest.raises(UsageError, match=r"application/octet-stream.*modelcar"):
        classify(
            manifest("application/vnd.example.thing+json", layer("application/octet-stream")),
            "oci://r/x:v1",
        )


def tar(entries: dict[str, bytes | None], symlinks: dict[str, str] | None = None) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, body in entries.items():
            info = tarfile.TarInfo(name)
            if body is None:
                info.type = tarfile.DIRTYPE
                archive.addfile(info)
            else:
                info.size = len(body)
                archive.addfile(info, io.BytesIO(body))
        for name, target in (symlinks or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            archive.addfile(info)
    return buffer.getvalue()


def unpacked(tmp_path: Path, layers: list[bytes], root: str = "models") -> dict[str, bytes]:
    staging, dest = tmp_path / "staging", tmp_path / "dest"
    staging.mkdir()
    dest.mkdir()
    planned = []
    for index, data in enumerate(layers):
        (staging / f"layer{index}").write_bytes(data)
        planned.append(Layer(RemoteFile(f"layer{index}", len(data), "v")))
    plan = Layered(tuple(planned), "sha256:x", root, whiteouts=True)
    records = unpack_layers(plan, staging, dest, lambda files: files, threading.Event())
    on_disk = {
        str(p.relative_to(dest)): p.read_bytes()
        for p in dest.rglob("*")
        if p.is_file() and not p.name.startswith(".")
    }
    assert set(records) == set(on_disk)
    return on_disk


def test_later_layers_replace_files_and_whiteouts_remove_what_lower_layers_wrote(tmp_path):
    base = tar(
        {
            "models/": None,
            "models/a.bin": b"a1",
            "models/gone.bin": b"old",
            "models/sub/c.txt": b"c",
            "models/sub/deeper/d.txt": b"d",
            "etc/passwd": b"root",
        }
    )
    top = tar(
        {
            "models/a.bin": b"a2",
            "models/.wh.gone.bin": b"",
            "models/sub/.wh..wh..opq": b"",
            "models/sub/new.txt": b"new",
        }
    )
    assert unpacked(tmp_path, [base, top]) == {"a.bin": b"a2", "sub/new.txt": b"new"}


def test_layers_that_each_name_the_folder_add_to_it_as_a_copy_per_file_builds_them(tmp_path):
    first = tar({"models/": None, "models/a.json": b"a"})
    second = tar({"models/": None, "models/b.json": b"b"})
    assert unpacked(tmp_path, [first, second]) == {"a.json": b"a", "b.json": b"b"}


def test_a_file_replaces_a_lower_folder_and_a_folder_a_lower_file(tmp_path):
    first = tar({"models/x/inner.txt": b"gone", "models/y": b"gone too"})
    second = tar({"models/x": b"now a file", "models/y/": None, "models/y/z.txt": b"z"})
    assert unpacked(tmp_path, [first, second]) == {"x": b"now a file", "y/z.txt": b"z"}


def test_the_sub_path_keeps_another_folder_and_links_become_copies(tmp_path):
    layers = [
        tar({"data/x.txt": b"x", "models/w.bin": b"w"}, symlinks={"data/link": "x.txt"}),
        zstd.compress(tar({"data/y.txt": b"y"})),
    ]
    assert unpacked(tmp_path, layers, root="data") == {
        "x.txt": b"x",
        "link": b"x",
        "y.txt": b"y",
    }


def test_an_image_without_the_kept_folder_says_to_name_one(tmp_path):
    with pytest.raises(NotFoundError, match=r"under models/.*sub-path"):
        unpacked(tmp_path, [tar({"app/main.py": b"print()"})])


def test_hostile_members_of_a_layer_land_nowhere(tmp_path):
    hostile = tar(
        {"models/../../escape.txt": b"x", "models/ok.txt": b"ok"},
        symlinks={"models/passwd": "/etc/passwd", "models/up": "../../../etc/shadow"},
    )
    assert unpacked(tmp_path, [hostile]) == {"ok.txt": b"ok"}
    assert not (tmp_path / "escape.txt").exists()

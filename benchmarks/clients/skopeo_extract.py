"""skopeo, then the files: ``skopeo copy docker://REF dir:WORK/dir``, made into a folder.

What someone without an OCI-aware initializer does: copy the manifest and blobs with skopeo, then
turn them into files. A ModelPack artifact: each layer's blob renamed to the path its
``org.cncf.model.filepath`` (else ``org.opencontainers.image.title``) annotation names. A modelcar
image: every layer untarred in order (``tar -x``, no whiteouts in the fixture) into one folder,
whose ``models/`` then becomes the destination. The work folder is removed at the end: the
extraction and the clean-up are part of getting the files.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

NAMES = ("org.cncf.model.filepath", "org.opencontainers.image.title")


def _blob(folder: Path, digest: str) -> Path:
    """Where skopeo's ``dir:`` transport keeps a sha256 blob: its hex digest as the name."""
    return folder / digest.removeprefix("sha256:")


def place_files(folder: Path, manifest: dict, dest: Path) -> None:
    """Each layer's blob moved to its annotated path (copied when two layers share a blob)."""
    moved: dict[str, Path] = {}
    for layer in manifest["layers"]:
        notes = layer.get("annotations") or {}
        name = next((notes[key] for key in NAMES if notes.get(key)), None)
        if not name or name.startswith("/") or ".." in Path(name).parts:
            raise SystemExit(f"layer {layer['digest']}: no usable file name ({name!r})")
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if layer["digest"] in moved:
            shutil.copyfile(moved[layer["digest"]], target)
        else:
            _blob(folder, layer["digest"]).rename(target)
            moved[layer["digest"]] = target


def untar_layers(folder: Path, manifest: dict, root: Path, dest: Path) -> None:
    """The image's layers applied in order into ``root``; its ``models/`` moved to ``dest``."""
    root.mkdir()
    for layer in manifest["layers"]:
        subprocess.run(
            ["tar", "-x", "-f", str(_blob(folder, layer["digest"])), "-C", str(root)], check=True
        )
    (root / "models").rename(dest)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--ref", required=True, help="HOST/REPO:TAG")
    parser.add_argument("--dest", type=Path, required=True)
    parser.add_argument("--work", type=Path, required=True, help="scratch, on dest's filesystem")
    parser.add_argument("--layout", choices=("artifact", "modelcar"), required=True)
    args = parser.parse_args()
    folder = args.work / "dir"
    args.work.mkdir(parents=True)
    subprocess.run(
        [
            "skopeo",
            "copy",
            "--insecure-policy",
            "--src-tls-verify=false",
            f"docker://{args.ref}",
            f"dir:{folder}",
        ],
        check=True,
    )
    manifest = json.loads((folder / "manifest.json").read_text())
    args.dest.parent.mkdir(parents=True, exist_ok=True)
    if args.layout == "artifact":
        args.dest.mkdir()
        place_files(folder, manifest, args.dest)
    else:
        untar_layers(folder, manifest, args.work / "rootfs", args.dest)
    shutil.rmtree(args.work)
    return 0


if __name__ == "__main__":
    sys.exit(main())

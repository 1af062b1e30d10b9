"""Rendering a kustomization without a cluster.

``kubectl kustomize`` (or a ``kustomize`` binary) is used when one is on PATH. Neither is
installable from the registries this project may use, so :func:`render_subset` is a small
renderer for the part of kustomize that runtimes/ uses (``resources`` and ``images``); it refuses
any other kustomization key, so adopting a new kustomize feature fails loudly here instead of
being ignored, and the tests compare it with the real renderer whenever one is present.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from tests.runtimes.manifests import load_documents

SUPPORTED_KEYS = {"apiVersion", "kind", "resources", "images"}
Obj = dict[str, Any]


def kustomize_command() -> list[str] | None:
    """The command line of a real renderer on this machine, or None."""
    if path := shutil.which("kustomize"):
        return [path, "build"]
    if path := shutil.which("kubectl"):
        return [path, "kustomize"]
    return None


def render_with_tool(directory: Path) -> list[Obj]:
    command = kustomize_command()
    if command is None:
        raise FileNotFoundError("neither kustomize nor kubectl is on PATH")
    result = subprocess.run(
        [*command, str(directory)], capture_output=True, text=True, timeout=60, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} {directory} failed: {result.stderr.strip()}")
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc is not None]


def render_subset(directory: Path) -> list[Obj]:
    """Render ``directory``'s kustomization.yaml: its resources with its images applied."""
    spec = load_documents(directory / "kustomization.yaml")[0]
    unsupported = set(spec) - SUPPORTED_KEYS
    if unsupported:
        raise ValueError(
            f"{directory}/kustomization.yaml uses {sorted(unsupported)}, which the test renderer "
            "does not implement: extend tests/runtimes/render.py or install kubectl"
        )
    docs: list[Obj] = []
    for entry in spec.get("resources", []):
        path = directory / entry
        docs.extend(render_subset(path) if path.is_dir() else load_documents(path))
    for doc in docs:
        for container in _containers(doc):
            container["image"] = apply_images(container["image"], spec.get("images", []))
    return docs


def split_image(ref: str) -> tuple[str, str | None, str | None]:
    """``name[:tag][@digest]`` → (name, tag, digest); a registry port is not a tag."""
    name, _, digest = ref.partition("@")
    slash = name.rfind("/")
    colon = name.rfind(":")
    tag = None
    if colon > slash:
        name, tag = name[:colon], name[colon + 1 :]
    return name, tag, digest or None


def apply_images(ref: str, images: list[Obj]) -> str:
    """Kustomize's image transformer for one image reference."""
    name, tag, digest = split_image(ref)
    for image in images:
        if image["name"] != name:
            continue
        name = image.get("newName", name)
        if "newTag" in image:
            tag, digest = str(image["newTag"]), None
        if "digest" in image:
            tag, digest = None, image["digest"]
        break
    return name + (f":{tag}" if tag else "") + (f"@{digest}" if digest else "")


def _containers(node: Any) -> Iterator[Obj]:
    """Every entry of any ``containers``/``initContainers`` list anywhere in ``node``."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("containers", "initContainers") and isinstance(value, list):
                yield from (c for c in value if isinstance(c, dict) and "image" in c)
            else:
                yield from _containers(value)
    elif isinstance(node, list):
        for item in node:
            yield from _containers(item)

"""Rendering a kustomization without a cluster.

``kubectl kustomize`` (or a ``kustomize`` binary) is used when one is on PATH. Neither is
installable from the registries this project may use, so :func:`render_subset` is a small
renderer for the part of kustomize that runtimes/ uses: ``resources``, ``components`` (the
asset-cache Component), JSON 6902 ``patches`` (add, remove, replace, test) with a ``target``
matched like kustomize matches it (anchored regular expressions), ``nameSuffix`` and ``images``,
in kustomize's order (resources, then components, then the kustomization's own patches, name
suffix and images). It refuses any other kustomization key, patch form or target field, so
adopting a new kustomize feature fails loudly here instead of being ignored, and the tests
compare it with the real renderer whenever one is present.
"""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from tests.runtimes.manifests import RUNTIMES_DIR, load_documents

SUPPORTED_KEYS = {
    "apiVersion", "kind", "resources", "components", "patches", "nameSuffix", "images",
}  # fmt: skip
TARGET_KEYS = {"group", "version", "kind", "name"}
COMPONENT_KIND = "Component"
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
    """Render ``directory``'s kustomization.yaml as kustomize would (the subset above)."""
    spec = load_documents(directory / "kustomization.yaml")[0]
    if spec.get("kind") == COMPONENT_KIND:
        raise ValueError(f"{directory} is a Component: render an overlay that lists it")
    return render_spec(spec, directory)


def with_component(component: Path, directory: Path = RUNTIMES_DIR) -> list[Obj]:
    """``directory``'s runtimes with ``component`` applied: what an overlay listing
    ``directory`` under resources and ``component`` under components renders."""
    return render_spec({"resources": [str(directory)], "components": [str(component)]}, directory)


def render_spec(spec: Obj, directory: Path, docs: list[Obj] | None = None) -> list[Obj]:
    """Apply one kustomization (or Component) ``spec`` whose paths are relative to
    ``directory``; a Component transforms ``docs``, what its parent accumulated so far."""
    unsupported = set(spec) - SUPPORTED_KEYS
    if unsupported:
        raise ValueError(
            f"{directory}/kustomization.yaml uses {sorted(unsupported)}, which the test renderer "
            "does not implement: extend tests/runtimes/render.py or install kubectl"
        )
    docs = [] if docs is None else docs
    for entry in spec.get("resources", []):
        path = directory / entry
        docs.extend(render_subset(path) if path.is_dir() else load_documents(path))
    for entry in spec.get("components", []):
        component = load_documents(directory / entry / "kustomization.yaml")[0]
        if component.get("kind") != COMPONENT_KIND:
            raise ValueError(f"{directory / entry} is listed as a component but is not one")
        docs = render_spec(component, directory / entry, docs)
    for patch in spec.get("patches", []):
        ops = _json6902(patch, directory)
        for doc in docs:
            if matches(patch.get("target", {}), doc):
                apply_json6902(doc, ops)
    if suffix := spec.get("nameSuffix"):
        for doc in docs:
            doc["metadata"]["name"] += suffix
    for doc in docs:
        for container in _containers(doc):
            container["image"] = apply_images(container["image"], spec.get("images", []))
    return docs


def _json6902(patch: Obj, directory: Path) -> list[Obj]:
    """The operations of one ``patches`` entry, which must be a JSON 6902 patch."""
    extra = set(patch) - {"path", "patch", "target"}
    if extra or ("path" in patch) == ("patch" in patch):
        raise ValueError(f"patch {patch}: give exactly one of path and patch, plus a target")
    if "path" in patch:
        ops = load_documents(directory / patch["path"])
        ops = ops[0] if len(ops) == 1 else ops
    else:
        ops = yaml.safe_load(patch["patch"])
    if not isinstance(ops, list):
        raise ValueError(f"patch {patch}: only JSON 6902 patches (a list of operations)")
    if not patch.get("target"):
        raise ValueError(f"patch {patch}: a JSON 6902 patch needs a target, as in kustomize")
    return ops


def matches(target: Obj, doc: Obj) -> bool:
    """Whether ``doc`` is selected by a patch ``target``: every field given is an anchored
    regular expression, as kustomize reads them (``kind: A|B`` selects both kinds)."""
    unknown = set(target) - TARGET_KEYS
    if unknown:
        raise ValueError(f"patch target fields {sorted(unknown)} are not implemented here")
    group, _, version = doc["apiVersion"].rpartition("/")
    actual = {"group": group, "version": version, "kind": doc["kind"]}
    actual["name"] = doc["metadata"]["name"]
    return all(re.fullmatch(f"(?:{want})", actual[key]) for key, want in target.items())


def apply_json6902(doc: Obj, ops: list[Obj]) -> None:
    """RFC 6902 ``add``, ``remove``, ``replace`` and ``test`` on ``doc``, in place; a failed
    test raises like kustomize's ``testing value PATH failed``."""
    for op in ops:
        *parents, last = _pointer(op["path"])
        parent: Any = doc
        for token in parents:
            parent = parent[int(token)] if isinstance(parent, list) else parent[token]
        kind = op["op"]
        if kind == "test":
            current = parent[int(last)] if isinstance(parent, list) else parent.get(last)
            if current != op["value"]:
                raise ValueError(f"testing value {op['path']} failed: {current!r}")
        elif kind == "add" and isinstance(parent, list):
            index = len(parent) if last == "-" else int(last)
            parent.insert(index, copy.deepcopy(op["value"]))
        elif kind in ("add", "replace"):
            if isinstance(parent, list):
                parent[int(last)] = copy.deepcopy(op["value"])
            elif kind == "replace" and last not in parent:
                raise KeyError(f"replace {op['path']}: nothing there")
            else:
                parent[last] = copy.deepcopy(op["value"])
        elif kind == "remove":
            del parent[int(last) if isinstance(parent, list) else last]
        else:
            raise ValueError(f"JSON 6902 op {kind!r} is not implemented here")


def _pointer(path: str) -> list[str]:
    if not path.startswith("/"):
        raise ValueError(f"{path!r} is not a JSON pointer")
    return [part.replace("~1", "/").replace("~0", "~") for part in path[1:].split("/")]


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

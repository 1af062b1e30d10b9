"""Rendering a kustomization without a cluster.

``kubectl kustomize`` (or a ``kustomize`` binary) is used when one is on PATH. Neither is
installable from the registries this project may use, so :func:`render_subset` is a small
renderer for the part of kustomize that runtimes/ uses: ``resources``, ``components`` (the
asset-cache and sharded-dataset Components), JSON 6902 ``patches`` (add, remove, replace, test)
with a ``target`` matched like kustomize matches it (anchored regular expressions),
``nameSuffix``, ``images`` and ``replacements`` (a scalar from one source object into fields that
exist, each keeping its type; selected by exact group, version, kind and name), in kustomize's
order (resources, then components, then the kustomization's own patches, name suffix, images and
replacements); objects annotated ``config.kubernetes.io/local-config: "true"`` take part and are
left out of the final output. It refuses any other kustomization key, patch or replacement form,
so adopting a new kustomize feature fails loudly here instead of being ignored, and the tests
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

from tests.runtimes.manifests import (
    ASSET_CACHE_DIR,
    RUNTIMES_DIR,
    SHARDED_DATASET_DIR,
    load_documents,
    sharding_settings,
)

SUPPORTED_KEYS = {
    "apiVersion", "kind", "resources", "components", "patches", "nameSuffix", "images",
    "replacements",
}  # fmt: skip
TARGET_KEYS = {"group", "version", "kind", "name"}
COMPONENT_KIND = "Component"
LOCAL_CONFIG = "config.kubernetes.io/local-config"
# A replacement field path's steps: a key, a list index, or a list item by ``[field=value]``.
PATH_STEP = re.compile(r"\[([^\].=]+)=([^\]]*)\]|([^.\[\]]+)")
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
    return drop_local_config(_accumulate(directory))


def _accumulate(directory: Path) -> list[Obj]:
    """``directory``'s objects before the end of the build: local-config objects still in."""
    spec = load_documents(directory / "kustomization.yaml")[0]
    if spec.get("kind") == COMPONENT_KIND:
        raise ValueError(f"{directory} is a Component: render an overlay that lists it")
    return render_spec(spec, directory)


def drop_local_config(docs: list[Obj]) -> list[Obj]:
    """What kustomize leaves out at the end of a build: objects only it reads."""
    return [doc for doc in docs if _annotations(doc).get(LOCAL_CONFIG) != "true"]


def _annotations(doc: Obj) -> dict[str, str]:
    return (doc.get("metadata") or {}).get("annotations") or {}


def with_component(component: Path, directory: Path = RUNTIMES_DIR) -> list[Obj]:
    """``directory``'s runtimes with ``component`` applied: what an overlay listing
    ``directory`` under resources and ``component`` under components renders."""
    return with_components([component], directory)


def with_components(
    components: list[Path], directory: Path = RUNTIMES_DIR, objects: list[Obj] | None = None
) -> list[Obj]:
    """What an overlay renders that lists ``directory`` and files holding ``objects`` (e.g. a
    component's local-config settings) under resources, and ``components`` in that order."""
    docs = _accumulate(directory) + copy.deepcopy(objects or [])
    spec = {"components": [str(component) for component in components]}
    return drop_local_config(render_spec(spec, directory, docs))


def with_sharded_dataset(shards: int | None = None, asset_cache: bool = False) -> list[Obj]:
    """The runtimes with the sharded-dataset component and its settings (K = ``shards``, else
    as sharding.yaml ships it), after the asset-cache component when ``asset_cache``."""
    components = [ASSET_CACHE_DIR] * asset_cache + [SHARDED_DATASET_DIR]
    return with_components(components, objects=[sharding_settings(shards)])


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
        docs.extend(_accumulate(path) if path.is_dir() else load_documents(path))
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
    for replacement in spec.get("replacements", []):
        apply_replacement(docs, replacement)
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


def apply_replacement(docs: list[Obj], replacement: Obj) -> None:
    """One ``replacements`` entry, as kustomize applies it: the value at the source's fieldPath,
    in the one object the source selects, written into every target's fieldPaths. Each of those
    fields must exist and be a string or a number; it keeps its type (kustomize copies the value
    and leaves the field's type, so 4 lands in a string as "4")."""
    if set(replacement) != {"source", "targets"}:
        raise ValueError(f"replacement {replacement}: only source and targets are implemented")
    source = replacement["source"]
    if set(source) - (TARGET_KEYS | {"fieldPath"}):
        raise ValueError(f"replacement source fields {sorted(source)} are not implemented here")
    selector = {key: value for key, value in source.items() if key != "fieldPath"}
    found = [doc for doc in docs if _selected_exactly(selector, doc)]
    if not found:
        raise ValueError(f"nothing selected by {selector}")
    if len(found) > 1:
        raise ValueError(f"multiple matches for selector {selector}")
    value = _field(found[0], source.get("fieldPath", "metadata.name"))
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise ValueError(f"replacement source {selector}: only a string or an integer here")
    for target in replacement["targets"]:
        if set(target) != {"select", "fieldPaths"} or set(target["select"]) - TARGET_KEYS:
            raise ValueError(f"replacement target {target}: only select and fieldPaths")
        for doc in docs:
            if _selected_exactly(target["select"], doc):
                for path in target["fieldPaths"]:
                    _set_scalar(doc, path, value)


def _selected_exactly(selector: Obj, doc: Obj) -> bool:
    """A replacement's selector: each field given equals the object's (no patterns)."""
    group, _, version = doc["apiVersion"].rpartition("/")
    actual = {"group": group, "version": version, "kind": doc["kind"]}
    actual["name"] = doc["metadata"]["name"]
    return all(actual[key] == want for key, want in selector.items())


def _steps(path: str) -> list[tuple[str, str] | str]:
    steps: list[tuple[str, str] | str] = []
    for part in path.split("."):
        match = PATH_STEP.fullmatch(part)
        if match is None:
            raise ValueError(f"field path {path!r}: step {part!r} is not implemented here")
        steps.append((match[1], match[2]) if match[1] else match[3])
    return steps


def _child(node: Any, step: tuple[str, str] | str, path: str) -> Any:
    if isinstance(step, tuple) and isinstance(node, list):
        for item in node:
            if isinstance(item, dict) and str(item.get(step[0])) == step[1]:
                return item
    elif isinstance(step, str) and isinstance(node, list) and step.isdigit():
        if int(step) < len(node):
            return node[int(step)]
    elif isinstance(step, str) and isinstance(node, dict) and step in node:
        return node[step]
    raise KeyError(f'unable to find field "{path}" in replacement target')


def _field(doc: Obj, path: str) -> Any:
    node: Any = doc
    for step in _steps(path):
        node = _child(node, step, path)
    return node


def _set_scalar(doc: Obj, path: str, value: str | int) -> None:
    *parents, last = _steps(path)
    node: Any = doc
    for step in parents:
        node = _child(node, step, path)
    current = _child(node, last, path)
    if isinstance(current, bool) or not isinstance(current, str | int):
        raise ValueError(f"replacement target {path}: only a string or integer field here")
    new = int(str(value)) if isinstance(current, int) else str(value)
    if isinstance(last, tuple):
        raise ValueError(f"replacement target {path}: ends at a list item, not a field")
    if isinstance(node, list):
        node[int(last)] = new
    else:
        node[last] = new


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

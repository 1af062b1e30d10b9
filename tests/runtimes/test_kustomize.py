"""`kubectl apply -k runtimes/` installs the runtimes with every image pinned in one place."""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path

import pytest
import yaml

from tests.runtimes import manifests, render

OUR_PREFIX = "ghcr.io/kubeflow-initializers/"
needs_renderer = pytest.mark.skipif(
    render.kustomize_command() is None,
    reason="neither kustomize nor kubectl on PATH: only the built-in subset renderer is checked",
)


def _key(doc: dict) -> tuple[str, str]:
    return doc["kind"], doc["metadata"]["name"]


def _images(docs: list[dict]) -> list[str]:
    return [c["image"] for doc in docs for _, c in manifests.all_containers(doc)]


def _project_version() -> str:
    with (manifests.REPO_ROOT / "pyproject.toml").open("rb") as stream:
        return tomllib.load(stream)["project"]["version"]


def test_rendering_yields_each_runtime_once_with_only_its_images_changed():
    rendered = {_key(doc): doc for doc in render.render_subset(manifests.RUNTIMES_DIR)}
    sources = {_key(doc): doc for doc in manifests.runtimes()}
    assert rendered.keys() == sources.keys()
    assert {name for _, name in rendered} == {
        "torch-distributed", "deepspeed-distributed", "torchtune-qwen2.5-1.5b",
    }  # fmt: skip
    for key, doc in rendered.items():
        for (_, before), (_, after) in zip(
            manifests.all_containers(sources[key]), manifests.all_containers(doc), strict=True
        ):
            assert {**after, "image": before["image"]} == before


@needs_renderer
def test_kubectl_kustomize_output_equals_the_subset_renderer_output():
    real = sorted(render.render_with_tool(manifests.RUNTIMES_DIR), key=_key)
    ours = sorted(render.render_subset(manifests.RUNTIMES_DIR), key=_key)
    assert real == ours


def test_every_image_is_named_untagged_in_the_runtimes_and_pinned_by_the_images_section():
    entries = {entry["name"]: entry for entry in manifests.kustomization()["images"]}
    for image in _images(manifests.runtimes()):
        name, tag, digest = render.split_image(image)
        assert tag is None and digest is None, f"{image}: tag it in kustomization.yaml only"
        assert name in entries, f"{image} has no entry in kustomization.yaml images"
    for entry in entries.values():
        assert entry.get("newName") and entry.get("newTag"), f"{entry['name']}: name and tag"
        assert entry["newTag"] != "latest"
    for image in _images(render.render_subset(manifests.RUNTIMES_DIR)):
        assert render.split_image(image)[1] not in (None, "latest"), image


def test_images_this_repo_builds_carry_the_project_version_as_their_tag():
    ours = [e for e in manifests.kustomization()["images"] if e["name"].startswith(OUR_PREFIX)]
    assert {e["name"].removeprefix(OUR_PREFIX) for e in ours} == {
        "dataset-initializer", "model-initializer", "torch-runtime", "mpi-runtime",
    }  # fmt: skip
    assert {e["newTag"] for e in ours} == {_project_version()}


@pytest.mark.parametrize("renderer", ["subset", pytest.param("tool", marks=needs_renderer)])
def test_an_admin_moves_every_image_to_a_mirror_by_editing_only_the_images_section(
    tmp_path: Path, renderer: str
):
    copy = tmp_path / "runtimes"
    shutil.copytree(manifests.RUNTIMES_DIR, copy)
    spec = manifests.kustomization(copy)
    for entry in spec["images"]:
        entry["newName"] = "mirror.internal:5000/ml/" + entry["name"].rsplit("/", 1)[1]
        entry["newTag"] = "9.9.9"
    (copy / "kustomization.yaml").write_text(yaml.safe_dump(spec))
    docs = render.render_subset(copy) if renderer == "subset" else render.render_with_tool(copy)
    images = _images(docs)
    assert images and all(i.startswith("mirror.internal:5000/ml/") for i in images), images
    assert all(i.endswith(":9.9.9") for i in images)


@pytest.mark.parametrize(
    ("kustomization", "refused"),
    [
        ("configMapGenerator: []", "configMapGenerator"),
        ("patches: [{target: {kind: A}, patch: 'metadata: {name: x}'}]", "only JSON 6902"),
        ("patches: [{target: {labelSelector: a=b}, patch: '[]'}]", "labelSelector"),
        ("patches: [{target: {kind: A}, patch: '[{op: move, from: /a, path: /b}]'}]", "move"),
        ("replacements: [{path: r.yaml}]", "only source and targets"),
        (
            "replacements: [{source: {kind: A, fieldPath: metadata.name}, targets: [{select: "
            "{kind: A}, fieldPaths: [metadata.name], options: {create: true}}]}]",
            "only select and fieldPaths",
        ),
        (
            "replacements: [{source: {kind: A, fieldPath: 'metadata.name'}, targets: [{select: "
            "{kind: A}, fieldPaths: ['metadata.labels[x]']}]}]",
            "is not implemented here",
        ),
    ],
    ids=["generator", "strategic-merge-patch", "label-selector", "move-op", "replacement-file",
         "replacement-options", "replacement-path-step"],
)  # fmt: skip
def test_subset_renderer_refuses_kustomize_features_it_does_not_implement(
    tmp_path: Path, kustomization: str, refused: str
):
    (tmp_path / "thing.yaml").write_text("apiVersion: v1\nkind: A\nmetadata: {name: a}\n")
    (tmp_path / "kustomization.yaml").write_text(f"resources: [thing.yaml]\n{kustomization}\n")
    with pytest.raises(ValueError, match=refused):
        render.render_subset(tmp_path)


REPLACED = """\
apiVersion: v1
kind: Settings
metadata:
  name: settings
  annotations: {config.kubernetes.io/local-config: "true"}
spec: {count: 4, size: "9"}
---
apiVersion: g.io/v1
kind: B
metadata: {name: b}
spec:
  replicas: 1
  jobs:
    - name: other
      env: [{name: N, value: keep}]
    - name: this
      env: [{name: OTHER, value: x}, {name: N, value: "1"}]
  sizes: [0]
"""


def _replacement(field: str, *paths: str, kind: str = "B", source: dict | None = None) -> dict:
    source = source or {"kind": "Settings", "name": "settings", "fieldPath": field}
    return {"source": source, "targets": [{"select": {"kind": kind}, "fieldPaths": list(paths)}]}


@pytest.mark.parametrize("renderer", ["subset", pytest.param("tool", marks=needs_renderer)])
def test_replacements_keep_each_fields_type_and_local_config_objects_stay_out_of_the_output(
    tmp_path: Path, renderer: str
):
    (tmp_path / "things.yaml").write_text(REPLACED)
    spec = {"resources": ["things.yaml"], "replacements": [
        _replacement("spec.count", "spec.replicas", "spec.jobs.[name=this].env.[name=N].value"),
        _replacement("spec.size", "spec.sizes.0"),
        _replacement("spec.count", "spec.replicas", kind="NoSuchKind"),  # selects nothing: fine
    ]}  # fmt: skip
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(spec))
    render_it = render.render_subset if renderer == "subset" else render.render_with_tool
    [doc] = render_it(tmp_path)  # the local-config Settings is read, then left out
    assert doc["spec"]["replicas"] == 4, "a number stays a number"
    assert doc["spec"]["jobs"][1]["env"][1] == {"name": "N", "value": "4"}, "a string a string"
    assert doc["spec"]["jobs"][0]["env"] == [{"name": "N", "value": "keep"}]
    assert doc["spec"]["sizes"] == [9], "by index, and a string source into a number"


NO_SOURCE = {"kind": "Nothing", "fieldPath": "spec"}
TWO_SOURCES = {"version": "v1", "fieldPath": "metadata.name"}  # every object here is v1


@pytest.mark.parametrize(
    ("replacement", "refused"),
    [
        (_replacement("spec.count", "spec.absent"), "unable to find field"),
        (_replacement("spec.count", "spec.jobs.[name=none].env"), "unable to find field"),
        (_replacement("", "spec.replicas", source=NO_SOURCE), "nothing selected by"),
        (_replacement("", "spec.replicas", source=TWO_SOURCES), "multiple matches"),
    ],
    ids=["missing-field", "missing-item", "no-source", "two-sources"],
)
@pytest.mark.parametrize("renderer", ["subset", pytest.param("tool", marks=needs_renderer)])
def test_a_replacement_stops_the_build_where_kustomize_stops_it(
    tmp_path: Path, renderer: str, replacement: dict, refused: str
):
    (tmp_path / "things.yaml").write_text(REPLACED.replace("apiVersion: g.io/v1", "apiVersion: v1"))
    spec = {"resources": ["things.yaml"], "replacements": [replacement]}
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(spec))
    render_it = render.render_subset if renderer == "subset" else render.render_with_tool
    with pytest.raises((ValueError, KeyError, RuntimeError), match=refused):
        render_it(tmp_path)


def test_json_6902_operations_and_targets_act_as_kustomize_applies_them():
    doc = {"apiVersion": "g.io/v1", "kind": "B", "metadata": {"name": "n"},
           "spec": {"items": ["a", "c"], "drop": 1, "x/y": 0}}  # fmt: skip
    assert render.matches({"group": "g.io", "kind": "A|B", "name": "n"}, doc)
    assert not render.matches({"kind": "B"}, {**doc, "kind": "BB"}), "anchored, as kustomize"
    render.apply_json6902(doc, [
        {"op": "test", "path": "/metadata/name", "value": "n"},
        {"op": "add", "path": "/spec/items/1", "value": "b"},
        {"op": "add", "path": "/spec/items/-", "value": "d"},
        {"op": "replace", "path": "/spec/x~1y", "value": 1},
        {"op": "remove", "path": "/spec/drop"},
    ])  # fmt: skip
    assert doc["spec"] == {"items": ["a", "b", "c", "d"], "x/y": 1}
    with pytest.raises(ValueError, match="testing value /spec/items/0 failed"):
        render.apply_json6902(doc, [{"op": "test", "path": "/spec/items/0", "value": "z"}])


@pytest.mark.parametrize(
    ("ref", "expected"),
    [
        ("a/b", ("a/b", None, None)),
        ("reg:5000/a/b:1.0", ("reg:5000/a/b", "1.0", None)),
        ("a/b@sha256:00", ("a/b", None, "sha256:00")),
    ],
)
def test_image_references_split_like_kustomize_reads_them(ref, expected):
    assert render.split_image(ref) == expected

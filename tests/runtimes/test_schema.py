"""Every YAML under runtimes/ is a valid Kubeflow Trainer (or core v1) object, field for field."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import yaml

from tests.runtimes import manifests, render, schema

ALL_FILES = [
    *manifests.runtime_files(),
    *manifests.example_files(),
    *manifests.asset_cache_object_files(),
]
WITH_ASSET_CACHE = render.with_component(manifests.ASSET_CACHE_DIR)
SHARDED = {
    "sharded-dataset": render.with_sharded_dataset(),
    "asset-cache+sharded-dataset": render.with_sharded_dataset(asset_cache=True),
}
SHARDED_RUNTIMES = [(variant, doc) for variant, docs in SHARDED.items() for doc in docs]


def _ids(paths: list[Path]) -> list[str]:
    return [str(path.relative_to(manifests.RUNTIMES_DIR)) for path in paths]


@pytest.mark.parametrize("path", ALL_FILES, ids=_ids(ALL_FILES))
def test_every_document_round_trips_through_the_published_api_models_unchanged(path: Path):
    docs = manifests.load_documents(path)
    assert docs, f"{path} holds no YAML document"
    for doc in docs:
        kind = doc.get("kind")
        assert kind in schema.MODELS, f"{path}: unexpected kind {kind!r}"
        assert doc["apiVersion"] == schema.API_VERSIONS[kind], f"{path}: apiVersion of {kind}"
        problems = schema.round_trip_differences(doc)
        assert not problems, f"{path} ({kind} {doc['metadata']['name']}):\n" + "\n".join(problems)


@pytest.mark.parametrize(
    "runtime", WITH_ASSET_CACHE, ids=[r["metadata"]["name"] for r in WITH_ASSET_CACHE]
)
def test_every_runtime_with_the_asset_cache_component_round_trips_unchanged(runtime):
    problems = schema.round_trip_differences(runtime)
    assert not problems, f"{runtime['metadata']['name']} + asset-cache:\n" + "\n".join(problems)


@pytest.mark.parametrize(
    ("variant", "runtime"),
    SHARDED_RUNTIMES,
    ids=[f"{doc['metadata']['name']}+{variant}" for variant, doc in SHARDED_RUNTIMES],
)
def test_every_runtime_with_the_sharded_dataset_component_round_trips_unchanged(variant, runtime):
    problems = schema.round_trip_differences(runtime)
    assert not problems, f"{runtime['metadata']['name']} + {variant}:\n" + "\n".join(problems)


def test_kustomization_installs_every_runtime_file_and_nothing_else():
    on_disk = {path.name for path in manifests.RUNTIMES_DIR.glob("*.yaml")} - {"kustomization.yaml"}
    listed = {path.name for path in manifests.runtime_files()}
    assert listed == on_disk
    for doc in manifests.runtimes():
        assert doc["kind"] == "ClusterTrainingRuntime"


def test_every_runtime_example_names_a_runtime_that_is_installed():
    installed = {runtime["metadata"]["name"] for runtime in manifests.runtimes()}
    covered = set()
    for path in manifests.example_files():
        for doc in manifests.load_documents(path):
            if doc["kind"] == "TrainJob":
                ref = doc["spec"]["runtimeRef"]
                assert ref["name"] in installed, f"{path}: no runtime named {ref['name']}"
                assert ref.get("kind", "ClusterTrainingRuntime") == "ClusterTrainingRuntime"
                covered.add(ref["name"])
    assert covered == installed, f"runtimes without a worked example: {installed - covered}"


@pytest.mark.parametrize(
    "mutation",
    [
        "misspelt volumeMounts",
        "misspelt dependsOn",
        "string where an integer belongs",
        "unknown mlPolicy field",
    ],
)
def test_round_trip_catches_a_misspelt_or_mistyped_field(mutation: str):
    runtime = copy.deepcopy(manifests.runtime_named("torch-distributed"))
    node = manifests.replicated_job(runtime, "node")
    init = manifests.container_named(
        manifests.replicated_job(runtime, "dataset-initializer"), "dataset-initializer"
    )
    if mutation == "misspelt volumeMounts":
        init["volumeMount"] = init.pop("volumeMounts")
    elif mutation == "misspelt dependsOn":
        node["dependOn"] = node.pop("dependsOn")
    elif mutation == "string where an integer belongs":
        runtime["spec"]["mlPolicy"]["numNodes"] = "1"
    else:
        runtime["spec"]["mlPolicy"]["torch"]["numProcPerNod"] = "auto"
    try:
        problems = schema.round_trip_differences(runtime)
    except ValueError:  # pydantic's ValidationError: rejected outright
        return
    assert problems, f"{mutation} went unnoticed"


def test_readme_examples_are_the_example_files():
    """The worked examples in runtimes/README.md say exactly what runtimes/examples/ holds."""
    readme = (manifests.RUNTIMES_DIR / "README.md").read_text()
    blocks = [
        [doc for doc in yaml.safe_load_all(block) if doc]
        for block in re.findall(r"```yaml\n(.*?)```", readme, flags=re.S)
    ]
    shown = {
        doc["metadata"]["name"]: docs
        for docs in blocks
        for doc in docs
        if doc.get("kind") == "TrainJob"
    }
    for path in manifests.example_files():
        docs = manifests.load_documents(path)
        [train_job] = [doc for doc in docs if doc["kind"] == "TrainJob"]
        assert shown.get(train_job["metadata"]["name"]) == docs, f"README differs from {path.name}"

"""The sharded-dataset component (runtimes/components/sharded-dataset): applied to every runtime
it makes the dataset initializer an Indexed Job of K pods, K chosen once in sharding.yaml, spread
across nodes on a ReadWriteMany workspace; the controller gives those K pods the indices 0..K-1
and one run; nothing else changes; it composes with the asset-cache component.

The schema, controller-rule and example checks of the sharded runtimes live beside those of the
plain ones (test_schema.py, test_controller_rules.py, test_contract_e2e.py); under podman in
test_podman_pods.py.
"""

from __future__ import annotations

import copy
import re
import shutil
from pathlib import Path

import pytest
import yaml

from initializers import dataset
from initializers.config import load_settings
from initializers.errors import ExitCode
from tests.runtimes import controller, manifests, render

STEP = "dataset-initializer"
SETTINGS = manifests.sharding_settings()
K = SETTINGS["spec"]["shards"]
WITH_SHARDS = render.with_sharded_dataset()
WITH_SHARDS_AND_CACHE = render.with_sharded_dataset(asset_cache=True)
PLAIN = {doc["metadata"]["name"]: doc for doc in render.render_subset(manifests.RUNTIMES_DIR)}
CACHED = {doc["metadata"]["name"]: doc for doc in render.with_component(manifests.ASSET_CACHE_DIR)}
IDS = [runtime["metadata"]["name"] for runtime in WITH_SHARDS]
SHARD_ENV = ("SHARDS", "SHARD_RUN")
# What a retry answers the same way (README "Exit codes"); the others are worth a new pod.
PERMANENT = [ExitCode.USAGE, ExitCode.AUTH, ExitCode.NOT_FOUND, ExitCode.INTEGRITY,
             ExitCode.LOCAL_STORAGE]  # fmt: skip
needs_renderer = pytest.mark.skipif(
    render.kustomize_command() is None,
    reason="neither kustomize nor kubectl on PATH: only the built-in subset renderer is checked",
)
per_sharded_runtime = pytest.mark.parametrize("runtime", WITH_SHARDS, ids=IDS)
both_renderers = pytest.mark.parametrize(
    "renderer", ["subset", pytest.param("tool", marks=needs_renderer)]
)


def _render(renderer: str, directory: Path) -> list[dict]:
    return (render.render_subset if renderer == "subset" else render.render_with_tool)(directory)


def _by_name(docs: list[dict]) -> list[dict]:
    return sorted(docs, key=lambda doc: doc["metadata"]["name"])


def _job(runtime: dict) -> dict:
    return manifests.step_job(runtime, STEP)["template"]["spec"]


def _container(runtime: dict) -> dict:
    return manifests.container_named(manifests.step_job(runtime, STEP), STEP)


def _claim(runtime: dict) -> dict:
    [template] = manifests.volume_claim_templates(runtime)
    return template


def _overlay(tmp_path: Path, components: list[str], settings: dict | None = SETTINGS) -> Path:
    """An overlay beside a copy of runtimes/, listing it, ``settings`` as sharding.yaml (the
    README's way) unless None, and ``components`` (folder names under runtimes/components)."""
    shutil.copytree(manifests.RUNTIMES_DIR, tmp_path / "runtimes")
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    resources = ["../runtimes"]
    if settings is not None:
        (overlay / "sharding.yaml").write_text(yaml.safe_dump(settings))
        resources.append("sharding.yaml")
    spec = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": resources,
        "components": [f"../runtimes/components/{name}" for name in components],
    }
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(spec))
    return overlay


def _readme_overlay() -> dict:
    """The overlay runtimes/README.md shows for the sharded runtimes."""
    readme = (manifests.RUNTIMES_DIR / "README.md").read_text()
    found = [
        doc
        for block in re.findall(r"```yaml\n(.*?)```", readme, flags=re.S)
        for doc in yaml.safe_load_all(block)
        if doc
        and doc.get("kind") == "Kustomization"
        and any("sharded-dataset" in entry for entry in doc.get("components", []))
    ]
    assert len(found) == 1, "runtimes/README.md shows one overlay with the sharded component"
    return found[0]


def _strip_sharding(runtime: dict, base: dict) -> dict:
    """``runtime`` with what the component adds taken out again, the claim template as in
    ``base`` (the runtime it was rendered from)."""
    stripped = copy.deepcopy(runtime)
    job = _job(stripped)
    for field in ("parallelism", "completionMode", "backoffLimitPerIndex", "maxFailedIndexes"):
        job.pop(field)
    job["template"]["spec"].pop("affinity")
    container = _container(stripped)
    container["env"] = [var for var in container["env"] if var["name"] not in SHARD_ENV]
    stripped["spec"]["template"]["spec"]["volumeClaimPolicies"] = copy.deepcopy(
        base["spec"]["template"]["spec"]["volumeClaimPolicies"]
    )
    return stripped


def _selects(term: dict, incoming: dict, other: dict) -> bool:
    """Whether the anti-affinity ``term`` of pod ``incoming`` counts pod ``other``: its
    labelSelector with each matchLabelKeys key set to ``incoming``'s value (what the API server
    merges into the selector when it creates the pod)."""
    wanted = dict(term["labelSelector"]["matchLabels"])
    wanted.update({key: incoming["metadata"]["labels"][key] for key in term["matchLabelKeys"]})
    labels = other["metadata"]["labels"]
    return all(labels.get(key) == value for key, value in wanted.items())


# ---- the dataset initializer's Job: K pods, Indexed, K in SHARDS too --------------------------


@per_sharded_runtime
def test_the_dataset_initializer_is_an_indexed_job_of_k_pods_and_its_shards_is_the_same_k(
    runtime,
):
    job = _job(runtime)
    assert job["parallelism"] == K >= 2
    assert job["completionMode"] == "Indexed"
    env = controller.resolve_env(_container(runtime), {}, pod={"metadata": {"labels": {}}})
    assert int(env["SHARDS"]) == job["parallelism"], "parallelism == SHARDS"
    assert "SHARD_INDEX" not in env, "SHARD_INDEX would win over JOB_COMPLETION_INDEX"


@pytest.mark.parametrize("shards", [2, 7])
@both_renderers
def test_k_is_set_in_one_place_sharding_yaml_and_lands_in_parallelism_and_shards_alike(
    tmp_path, renderer, shards
):
    overlay = _overlay(tmp_path, ["sharded-dataset"], manifests.sharding_settings(shards))
    rendered = _render(renderer, overlay)
    assert {doc["metadata"]["name"] for doc in rendered} == set(PLAIN), "settings not applied"
    for runtime in rendered:
        assert _job(runtime)["parallelism"] == shards
        assert manifests.env_value(_container(runtime), "SHARDS") == str(shards)


@both_renderers
def test_without_sharding_yaml_the_component_stops_instead_of_rendering_one_pod(tmp_path, renderer):
    overlay = _overlay(tmp_path, ["sharded-dataset"], settings=None)
    with pytest.raises((ValueError, RuntimeError), match="nothing selected by"):
        _render(renderer, overlay)


def test_sharding_yaml_is_a_kustomize_only_object_that_never_reaches_the_cluster():
    annotations = SETTINGS["metadata"]["annotations"]
    assert annotations == {"config.kubernetes.io/local-config": "true"}
    assert SETTINGS["kind"] not in {doc["kind"] for doc in WITH_SHARDS}
    assert SETTINGS["spec"]["storageClassName"].startswith("replace-with-")
    text = manifests.SHARDING_SETTINGS.read_text()
    for option in ("EFS", "Filestore", "Azure Files", "NFS", "Lustre"):
        assert option in text, f"sharding.yaml does not name {option} as a ReadWriteMany option"


# ---- what the controller makes of it ----------------------------------------------------------


@per_sharded_runtime
def test_the_controller_gives_k_pods_the_indices_0_to_k_minus_1_and_one_run_the_job_uid(
    runtime,
):
    train_job = {"metadata": {"name": "big-data"}, "spec": {}}
    job = controller.initializer_job(runtime, STEP, train_job)
    assert (job["parallelism"], job["completions"], job["completionMode"]) == (K, K, "Indexed")
    pods = controller.initializer_pods(runtime, STEP, train_job, job_uid="uid-of-run-1")
    envs = [controller.resolve_env(controller.step_container(p, STEP), {}, pod=p) for p in pods]
    assert [env["JOB_COMPLETION_INDEX"] for env in envs] == [str(i) for i in range(K)]
    assert {env["SHARDS"] for env in envs} == {str(K)}
    assert {env["SHARD_RUN"] for env in envs} == {"uid-of-run-1"}
    # As the initializer reads them: each pod its own share of the same K, in the same run.
    settings = [
        load_settings(dataset.DEFAULTS, [], {**env, "STORAGE_URI": "s3://bucket/data"})
        for env in envs
    ]
    assert [(s.shards, s.shard_index, s.shard_run) for s in settings] == [
        (K, i, "uid-of-run-1") for i in range(K)
    ]


@per_sharded_runtime
def test_a_new_job_of_the_same_trainjob_is_a_new_run_and_a_restarted_pod_is_not(runtime):
    """JobSet recreates a failed run's Jobs (new UIDs): their pods replace the old plan. A pod
    the Job replaces carries the same Job UID, so it resumes."""
    train_job = {"metadata": {"name": "big-data"}, "spec": {}}

    def runs(uid: str) -> set[str]:
        pods = controller.initializer_pods(runtime, STEP, train_job, job_uid=uid)
        return {
            controller.resolve_env(controller.step_container(p, STEP), {}, pod=p)["SHARD_RUN"]
            for p in pods
        }

    assert runs("uid-1") == runs("uid-1") == {"uid-1"}
    assert runs("uid-2") == {"uid-2"}


@per_sharded_runtime
def test_the_pods_spread_across_nodes_by_preference_counting_only_this_jobs_pods(runtime):
    pod_spec = manifests.pod_spec(manifests.step_job(runtime, STEP))
    anti = pod_spec["affinity"]["podAntiAffinity"]
    assert set(anti) == {"preferredDuringSchedulingIgnoredDuringExecution"}, "preferred only"
    [preference] = anti["preferredDuringSchedulingIgnoredDuringExecution"]
    term = preference["podAffinityTerm"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert not set(term["matchLabelKeys"]) & set(term["labelSelector"]["matchLabels"])
    train_job = {"metadata": {"name": "big-data"}, "spec": {}}
    pods = controller.initializer_pods(runtime, STEP, train_job, job_uid="uid-1")
    others = [
        *controller.initializer_pods(
            runtime, STEP, {"metadata": {"name": "b"}, "spec": {}}, "uid-9"
        ),
        *controller.initializer_pods(runtime, "model-initializer", train_job, "uid-2"),
    ]
    for pod in pods:
        assert all(_selects(term, pod, sibling) for sibling in pods)
        assert not any(_selects(term, pod, other) for other in others)


@per_sharded_runtime
def test_retries_are_per_index_and_exit_codes_a_retry_would_repeat_fail_the_job_at_once(
    runtime,
):
    job = controller.initializer_job(runtime, STEP, {"spec": {}})
    # What the component set arrives unchanged: the controller rewrites only the pod count.
    for field in ("backoffLimitPerIndex", "maxFailedIndexes", "podFailurePolicy"):
        assert job[field] == _job(runtime)[field], field
    assert job["backoffLimitPerIndex"] >= 1
    assert job["maxFailedIndexes"] == 0, "one share lost for good: the trainer cannot start"
    assert "backoffLimit" not in job, "with backoffLimitPerIndex it defaults to the maximum"
    assert job["template"]["spec"]["restartPolicy"] == "Never", "what podFailurePolicy needs"
    fail, ignore = job["podFailurePolicy"]["rules"]
    assert fail["action"] == "FailJob"
    assert fail["onExitCodes"] == {"containerName": STEP, "operator": "In", "values": PERMANENT}
    assert ignore == {
        "action": "Ignore",
        "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
    }
    retried = {ExitCode.UNEXPECTED, ExitCode.UNAVAILABLE, ExitCode.INTERRUPTED}
    assert not retried & set(fail["onExitCodes"]["values"])


@per_sharded_runtime
def test_the_workspace_claim_becomes_read_write_many_with_the_class_and_size_of_sharding_yaml(
    runtime,
):
    claim = _claim(runtime)
    assert claim["metadata"]["name"] == "initializer"
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert claim["spec"]["storageClassName"] == SETTINGS["spec"]["storageClassName"]
    assert claim["spec"]["resources"]["requests"]["storage"] == SETTINGS["spec"]["storage"]


@per_sharded_runtime
def test_the_model_initializer_and_the_trainer_pods_are_untouched(runtime):
    plain = PLAIN[runtime["metadata"]["name"]]
    assert manifests.replicated_jobs(runtime)[1:] == manifests.replicated_jobs(plain)[1:]
    model = controller.initializer_pods(runtime, "model-initializer", {"spec": {}}, "uid")
    assert len(model) == 1


@per_sharded_runtime
def test_the_component_adds_the_sharding_fields_and_changes_the_claim_and_nothing_else(runtime):
    plain = PLAIN[runtime["metadata"]["name"]]
    assert _strip_sharding(runtime, plain) == plain


# ---- kustomize: the real renderer, other layouts, the README's overlay ------------------------


@needs_renderer
def test_kubectl_kustomize_applies_the_component_exactly_as_the_subset_renderer(tmp_path):
    real = render.render_with_tool(_overlay(tmp_path, ["sharded-dataset"]))
    assert _by_name(real) == _by_name(WITH_SHARDS)


@pytest.mark.parametrize(
    "order", [["asset-cache", "sharded-dataset"], ["sharded-dataset", "asset-cache"]],
    ids=["cache-first", "shards-first"],
)  # fmt: skip
@both_renderers
def test_the_component_composes_with_the_asset_cache_component(tmp_path, renderer, order):
    """Both applied: each adds exactly what it adds alone, in either order, and the two
    renderers agree."""
    rendered = _by_name(_render(renderer, _overlay(tmp_path, order)))
    if order[0] == "asset-cache":
        assert rendered == _by_name(WITH_SHARDS_AND_CACHE)
    for runtime in rendered:
        name = runtime["metadata"]["name"]
        env = {var["name"] for var in _container(runtime)["env"]}
        assert {"CACHE_DIR", *SHARD_ENV} <= env
        assert _strip_sharding(runtime, CACHED[name]) == CACHED[name]
        assert manifests.mount_path(_container(runtime), manifests.CACHE_VOLUME) == "/cache"
        assert _job(runtime)["parallelism"] == K


@both_renderers
def test_the_component_stops_on_a_runtime_whose_jobs_are_not_where_its_patches_point(
    tmp_path, renderer
):
    overlay = _overlay(tmp_path, ["sharded-dataset"])
    path = tmp_path / "runtimes" / "torch-distributed.yaml"
    runtime = manifests.load_documents(path)[0]
    jobs = manifests.replicated_jobs(runtime)
    jobs[0], jobs[1] = jobs[1], jobs[0]
    path.write_text(yaml.safe_dump(runtime))
    with pytest.raises((ValueError, RuntimeError), match="testing value"):
        _render(renderer, overlay)


@both_renderers
def test_the_component_shards_a_namespaced_training_runtime_as_well(tmp_path, renderer):
    runtime = copy.deepcopy(manifests.runtime_named("torch-distributed"))
    runtime["kind"] = "TrainingRuntime"
    (tmp_path / "runtimes").mkdir()
    (tmp_path / "runtimes" / "torch.yaml").write_text(yaml.safe_dump(runtime))
    (tmp_path / "runtimes" / "kustomization.yaml").write_text("resources: [torch.yaml]\n")
    shutil.copytree(manifests.SHARDED_DATASET_DIR, tmp_path / "sharded-dataset")
    (tmp_path / "team-a").mkdir()
    shutil.copy(manifests.SHARDING_SETTINGS, tmp_path / "team-a" / "sharding.yaml")
    overlay = {"resources": ["../runtimes", "sharding.yaml"], "components": ["../sharded-dataset"]}
    (tmp_path / "team-a" / "kustomization.yaml").write_text(yaml.safe_dump(overlay))
    [sharded] = _render(renderer, tmp_path / "team-a")
    assert sharded["kind"] == "TrainingRuntime"
    assert _job(sharded)["parallelism"] == K
    assert manifests.env_value(_container(sharded), "SHARDS") == str(K)


@both_renderers
def test_the_readme_overlay_installs_every_runtime_sharded_under_a_name_of_its_own(
    tmp_path, renderer
):
    overlay = _readme_overlay()
    assert "sharding.yaml" in overlay["resources"]
    shutil.copytree(manifests.RUNTIMES_DIR, tmp_path / "runtimes")
    (tmp_path / "sharded-runtimes").mkdir()
    (tmp_path / "sharded-runtimes" / "kustomization.yaml").write_text(yaml.safe_dump(overlay))
    # The README's commands: copy sharding.yaml beside the overlay.
    shutil.copy(manifests.SHARDING_SETTINGS, tmp_path / "sharded-runtimes")
    rendered = _by_name(_render(renderer, tmp_path / "sharded-runtimes"))
    suffix = overlay["nameSuffix"]
    assert [doc["metadata"]["name"] for doc in rendered] == sorted(n + suffix for n in PLAIN)
    for doc in rendered:
        doc["metadata"]["name"] = doc["metadata"]["name"].removesuffix(suffix)
    assert rendered == _by_name(WITH_SHARDS), "the suffix is all the overlay adds"

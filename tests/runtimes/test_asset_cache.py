"""The asset-cache component (runtimes/components/asset-cache): applied to every runtime it mounts
one claim at one path in the initializers and the trainers, tells the initializers where, and
changes nothing else; its claim and prune CronJob are what runtimes/README.md says.

The schema, controller-rule and image checks of the cached runtimes live beside those of the
plain ones (test_schema.py, test_controller_rules.py, test_images.py); the examples run against
them in test_contract_e2e.py, and under podman in test_podman_pods.py.
"""

from __future__ import annotations

import copy
import re
import shlex
import shutil
from pathlib import Path, PurePosixPath

import pytest
import yaml

from initializers.cachetool import _parser, parse_duration, parse_size
from tests.runtimes import controller, manifests, render

WITH_ASSET_CACHE = render.with_component(manifests.ASSET_CACHE_DIR)
PLAIN = {doc["metadata"]["name"]: doc for doc in render.render_subset(manifests.RUNTIMES_DIR)}
IDS = [runtime["metadata"]["name"] for runtime in WITH_ASSET_CACHE]
VOLUME, MOUNT = manifests.CACHE_VOLUME, manifests.CACHE_MOUNT
needs_renderer = pytest.mark.skipif(
    render.kustomize_command() is None,
    reason="neither kustomize nor kubectl on PATH: only the built-in subset renderer is checked",
)
per_cached_runtime = pytest.mark.parametrize("runtime", WITH_ASSET_CACHE, ids=IDS)


def _is_initializer(container: dict) -> bool:
    return container["name"] in manifests.INITIALIZER_STEPS


def _readme_overlay() -> dict:
    """The overlay runtimes/README.md tells users to write for the cache (its one Kustomization
    block listing the asset-cache component)."""
    readme = (manifests.RUNTIMES_DIR / "README.md").read_text()
    found = [
        doc
        for block in re.findall(r"```yaml\n(.*?)```", readme, flags=re.S)
        for doc in yaml.safe_load_all(block)
        if doc
        and doc.get("kind") == "Kustomization"
        and any("asset-cache" in entry for entry in doc.get("components", []))
    ]
    assert len(found) == 1, "runtimes/README.md shows one overlay with the component"
    return found[0]


def _beside_a_copy_of_runtimes(tmp_path: Path, overlay: dict, name: str) -> Path:
    """``overlay`` written as ``tmp_path/name/kustomization.yaml`` beside a copy of runtimes/,
    where the README's relative paths point."""
    shutil.copytree(manifests.RUNTIMES_DIR, tmp_path / "runtimes")
    (tmp_path / name).mkdir()
    (tmp_path / name / "kustomization.yaml").write_text(yaml.safe_dump(overlay))
    return tmp_path / name


def _by_name(docs: list[dict]) -> list[dict]:
    return sorted(docs, key=lambda doc: doc["metadata"]["name"])


# ---- what the component adds, and only that --------------------------------------------------


@per_cached_runtime
def test_every_pod_gets_the_namespace_cache_claim_as_one_volume(runtime):
    claim = manifests.asset_cache_object("PersistentVolumeClaim")["metadata"]["name"]
    for rjob in manifests.replicated_jobs(runtime):
        volumes = [v for v in manifests.pod_spec(rjob)["volumes"] if v["name"] == VOLUME]
        assert volumes == [{"name": VOLUME, "persistentVolumeClaim": {"claimName": claim}}], rjob[
            "name"
        ]


@per_cached_runtime
def test_initializers_and_trainers_mount_the_cache_at_the_one_path_cache_dir_names(runtime):
    """The links the initializers make are absolute paths under CACHE_DIR: every container that
    follows them must see the claim at exactly that path."""
    cache_dirs = set()
    for step in manifests.INITIALIZER_STEPS:
        container = controller.initializer_container(runtime, step, {"spec": {}})
        cache_dirs.add(controller.resolve_env(container, {})["CACHE_DIR"])
    assert cache_dirs == {MOUNT}
    for rjob, container in manifests.all_containers(runtime):
        where = f"{rjob['name']}/{container['name']}"
        [mount] = [m for m in container["volumeMounts"] if m["name"] == VOLUME]
        assert mount["mountPath"] == MOUNT, where
        # Trainers only read the entries; the initializers fill them.
        assert mount.get("readOnly", False) is not _is_initializer(container), where
        if not _is_initializer(container):
            assert manifests.env_value(container, "CACHE_DIR") is None, where
    trainers = [c for _, c in controller.trainer_containers(runtime, {"spec": {}})]
    assert trainers and all(manifests.mount_path(c, VOLUME) == MOUNT for c in trainers)


@per_cached_runtime
def test_workspace_stays_mounted_at_workspace_and_the_output_folders_are_never_mount_points(
    runtime,
):
    """--output becomes a symlink into the cache, which a mount point cannot become."""
    outputs = {
        manifests.env_value(
            controller.initializer_container(runtime, step, {"spec": {}}), "OUTPUT_PATH"
        )
        for step in manifests.INITIALIZER_STEPS
    }
    assert outputs == {"/workspace/model", "/workspace/dataset"}
    for rjob, container in manifests.all_containers(runtime):
        where = f"{rjob['name']}/{container['name']}"
        assert manifests.mount_path(container, "initializer") == "/workspace", where
        for mount in container["volumeMounts"]:
            path = PurePosixPath(mount["mountPath"])
            assert not any(path.is_relative_to(output) for output in outputs), where
            if mount["name"] != "initializer":
                assert not path.is_relative_to("/workspace"), f"{where}: {path} in /workspace"
    assert not PurePosixPath("/workspace").is_relative_to(MOUNT)


@per_cached_runtime
def test_the_component_adds_the_cache_volume_mounts_and_cache_dir_and_nothing_else(runtime):
    stripped = copy.deepcopy(runtime)
    for rjob in manifests.replicated_jobs(stripped):
        pod = manifests.pod_spec(rjob)
        pod["volumes"] = [v for v in pod["volumes"] if v["name"] != VOLUME]
        for container in pod["containers"]:
            mounts = container["volumeMounts"]
            container["volumeMounts"] = [m for m in mounts if m["name"] != VOLUME]
            if "env" in container:
                container["env"] = [v for v in container["env"] if v["name"] != "CACHE_DIR"]
    assert stripped == PLAIN[runtime["metadata"]["name"]]


@needs_renderer
def test_kubectl_kustomize_applies_the_component_exactly_as_the_subset_renderer(tmp_path):
    overlay = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": ["../runtimes"],
        "components": ["../runtimes/components/asset-cache"],
    }
    directory = _beside_a_copy_of_runtimes(tmp_path, overlay, "overlay")
    real = render.render_with_tool(directory)
    assert _by_name(real) == _by_name(render.render_subset(directory))
    assert _by_name(real) == _by_name(WITH_ASSET_CACHE)


@pytest.mark.parametrize("renderer", ["subset", pytest.param("tool", marks=needs_renderer)])
def test_the_component_stops_on_a_runtime_whose_jobs_are_not_where_its_patches_point(
    tmp_path: Path, renderer: str
):
    """Patches go by index: on a runtime laid out otherwise, each patch's own test fails and
    nothing is rendered, instead of the cache being mounted into the wrong pod."""
    overlay = {"resources": ["../runtimes"], "components": ["../runtimes/components/asset-cache"]}
    directory = _beside_a_copy_of_runtimes(tmp_path, overlay, "overlay")
    path = tmp_path / "runtimes" / "torch-distributed.yaml"
    runtime = manifests.load_documents(path)[0]
    jobs = manifests.replicated_jobs(runtime)
    jobs[0], jobs[1] = jobs[1], jobs[0]
    path.write_text(yaml.safe_dump(runtime))
    render_it = render.render_subset if renderer == "subset" else render.render_with_tool
    with pytest.raises((ValueError, RuntimeError), match="testing value"):
        render_it(directory)


@pytest.mark.parametrize("renderer", ["subset", pytest.param("tool", marks=needs_renderer)])
def test_the_component_patches_a_namespaced_training_runtime_as_well(tmp_path, renderer):
    """The README's way to keep runtime, claim and TrainJobs in one namespace."""
    runtime = copy.deepcopy(manifests.runtime_named("torch-distributed"))
    runtime["kind"] = "TrainingRuntime"
    (tmp_path / "runtimes").mkdir()
    (tmp_path / "runtimes" / "torch.yaml").write_text(yaml.safe_dump(runtime))
    (tmp_path / "runtimes" / "kustomization.yaml").write_text("resources: [torch.yaml]\n")
    shutil.copytree(manifests.ASSET_CACHE_DIR, tmp_path / "asset-cache")
    overlay = {"resources": ["../runtimes"], "components": ["../asset-cache"]}
    (tmp_path / "team-a").mkdir()
    (tmp_path / "team-a" / "kustomization.yaml").write_text(yaml.safe_dump(overlay))
    render_it = render.render_subset if renderer == "subset" else render.render_with_tool
    [patched] = render_it(tmp_path / "team-a")
    assert patched["kind"] == "TrainingRuntime"
    for _, container in manifests.all_containers(patched):
        assert manifests.mount_path(container, VOLUME) == MOUNT


@pytest.mark.parametrize("renderer", ["subset", pytest.param("tool", marks=needs_renderer)])
def test_the_readme_overlay_installs_every_runtime_with_the_cache_under_a_name_of_its_own(
    tmp_path: Path, renderer: str
):
    overlay = _readme_overlay()
    directory = _beside_a_copy_of_runtimes(tmp_path, overlay, "cached-runtimes")
    render_it = render.render_subset if renderer == "subset" else render.render_with_tool
    rendered = _by_name(render_it(directory))
    suffix = overlay["nameSuffix"]
    assert [doc["metadata"]["name"] for doc in rendered] == sorted(n + suffix for n in PLAIN)
    for doc in rendered:
        doc["metadata"]["name"] = doc["metadata"]["name"].removesuffix(suffix)
    assert rendered == _by_name(WITH_ASSET_CACHE), "the suffix is all the overlay adds"


# ---- the claim and the prune job a namespace applies ------------------------------------------


def test_the_cache_claim_is_read_write_many_and_leaves_the_storage_class_to_the_user():
    claim = manifests.asset_cache_object("PersistentVolumeClaim")
    assert claim["metadata"]["name"] == VOLUME
    assert "namespace" not in claim["metadata"], "applied per namespace with -n"
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert claim["spec"]["storageClassName"].startswith("replace-with-")
    text = (manifests.ASSET_CACHE_DIR / "pvc.yaml").read_text()
    for option in ("EFS", "Filestore", "Azure Files", "NFS", "Lustre"):
        assert option in text, f"pvc.yaml does not name {option} as a ReadWriteMany option"


def test_the_prune_cron_job_never_overlaps_and_keeps_the_cache_below_its_claim():
    cron = manifests.asset_cache_object("CronJob")
    claim = manifests.asset_cache_object("PersistentVolumeClaim")
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"
    job = manifests.cron_job_as_replicated_job(cron)
    pod = manifests.pod_spec(job)
    assert pod["restartPolicy"] in ("Never", "OnFailure")
    [container] = manifests.containers(job)
    script = container["args"][container["args"].index("-c") + 1]
    [prune] = [shlex.split(part) for part in script.split("&&") if "prune" in part]
    assert prune[0] == "initializer-cache"
    args = _parser().parse_args(prune[1:])
    assert args.command == "prune" and not args.dry_run
    assert parse_size(args.max_size) < parse_size(claim["spec"]["resources"]["requests"]["storage"])
    assert parse_duration(args.older_than) >= parse_duration("1d")
    # The same claim, at the same path, named by CACHE_DIR, as in the initializers.
    assert manifests.mount_path(container, VOLUME) == MOUNT
    assert manifests.env_value(container, "CACHE_DIR") == MOUNT
    [volume] = [v for v in pod["volumes"] if v["name"] == VOLUME]
    assert volume["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]


def test_the_prune_job_runs_the_model_initializer_image_as_the_initializers_user():
    """It deletes what the initializers wrote: same image and release, same user and group."""
    cron = manifests.asset_cache_object("CronJob")
    job = manifests.cron_job_as_replicated_job(cron)
    [container] = manifests.containers(job)
    pinned = {e["name"]: e for e in manifests.kustomization()["images"]}
    name, tag, _ = render.split_image(container["image"])
    assert name == "ghcr.io/kubeflow-initializers/model-initializer"
    assert tag == str(pinned[name]["newTag"]), "keep it at the release kustomization.yaml pins"
    runtime = manifests.runtime_named("torch-distributed")
    initializer = manifests.step_job(runtime, "model-initializer")
    assert (
        manifests.pod_spec(job)["securityContext"]
        == (manifests.pod_spec(initializer)["securityContext"])
    )
    reference = manifests.container_named(initializer, "model-initializer")
    assert container["securityContext"] == reference["securityContext"]
    assert manifests.mount_path(container, "tmp") == "/tmp", "HOME on the read-only root"

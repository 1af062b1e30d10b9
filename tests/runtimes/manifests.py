"""Reading runtimes/ as plain dicts: the YAML documents, their ReplicatedJobs and containers.

The tests only ever look at Kubernetes objects through these few accessors, so the paths into a
ClusterTrainingRuntime (spec.template.spec.replicatedJobs[].template.spec.template.spec...) are
spelt out once.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
RUNTIMES_DIR = REPO_ROOT / "runtimes"
EXAMPLES_DIR = RUNTIMES_DIR / "examples"
ASSET_CACHE_DIR = RUNTIMES_DIR / "components" / "asset-cache"
# The asset-cache component's names (runtimes/components/asset-cache): the volume and claim it
# adds to every pod, and where every container mounts it.
CACHE_VOLUME = "initializer-cache"
CACHE_MOUNT = "/cache"
# The sharded-dataset component (runtimes/components/sharded-dataset) and the settings object a
# user copies into an overlay beside it: K and the workspace's storage class and size.
SHARDED_DATASET_DIR = RUNTIMES_DIR / "components" / "sharded-dataset"
SHARDING_SETTINGS = SHARDED_DATASET_DIR / "sharding.yaml"

ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
FRAMEWORK_LABEL = "trainer.kubeflow.org/framework"
INITIALIZER_STEPS = ("dataset-initializer", "model-initializer")
RUNTIME_KINDS = ("ClusterTrainingRuntime", "TrainingRuntime")

Obj = dict[str, Any]


def load_documents(path: Path) -> list[Obj]:
    """Every non-empty YAML document in ``path``."""
    with path.open() as stream:
        return [doc for doc in yaml.safe_load_all(stream) if doc is not None]


def kustomization(directory: Path = RUNTIMES_DIR) -> Obj:
    return load_documents(directory / "kustomization.yaml")[0]


def runtime_files() -> list[Path]:
    """The runtime YAMLs that `kubectl apply -k runtimes/` installs, in kustomization order."""
    return [RUNTIMES_DIR / name for name in kustomization()["resources"]]


def example_files() -> list[Path]:
    return sorted(EXAMPLES_DIR.glob("*.yaml"))


def asset_cache_object_files() -> list[Path]:
    """The Kubernetes objects a namespace applies beside the asset-cache component (its claim
    and the prune CronJob); the component's own kustomization and patches are not objects."""
    return [ASSET_CACHE_DIR / "pvc.yaml", ASSET_CACHE_DIR / "prune-cronjob.yaml"]


def asset_cache_object(kind: str) -> Obj:
    for path in asset_cache_object_files():
        for doc in load_documents(path):
            if doc["kind"] == kind:
                return doc
    raise KeyError(f"no {kind} in {ASSET_CACHE_DIR}")


def sharding_settings(shards: int | None = None) -> Obj:
    """The sharded-dataset component's settings object as shipped, or with K = ``shards``."""
    [settings] = load_documents(SHARDING_SETTINGS)
    if shards is not None:
        settings["spec"]["shards"] = shards
    return settings


def cron_job_as_replicated_job(cron_job: Obj) -> Obj:
    """A CronJob's Job template in the shape of a ReplicatedJob, so :func:`pod_spec` and
    :func:`containers` read it too (both hold a Job template at ``template``)."""
    return {"name": cron_job["metadata"]["name"], "template": cron_job["spec"]["jobTemplate"]}


def runtimes() -> list[Obj]:
    return [doc for path in runtime_files() for doc in load_documents(path)]


def runtime_named(name: str) -> Obj:
    for runtime in runtimes():
        if runtime["metadata"]["name"] == name:
            return runtime
    raise KeyError(f"no runtime named {name!r} in {RUNTIMES_DIR}")


def replicated_jobs(runtime: Obj) -> list[Obj]:
    return runtime["spec"]["template"]["spec"]["replicatedJobs"]


def replicated_job(runtime: Obj, name: str) -> Obj:
    for rjob in replicated_jobs(runtime):
        if rjob["name"] == name:
            return rjob
    raise KeyError(f"runtime {runtime['metadata']['name']} has no ReplicatedJob {name!r}")


def job_labels(rjob: Obj) -> dict[str, str]:
    """Labels on the ReplicatedJob's Job template (where the controller looks for the ancestor)."""
    return (rjob["template"].get("metadata") or {}).get("labels") or {}


def ancestor(rjob: Obj) -> str | None:
    return job_labels(rjob).get(ANCESTOR_LABEL)


def pod_spec(rjob: Obj) -> Obj:
    return rjob["template"]["spec"]["template"]["spec"]


def containers(rjob: Obj) -> list[Obj]:
    return pod_spec(rjob)["containers"]


def all_containers(runtime: Obj) -> Iterator[tuple[Obj, Obj]]:
    """(ReplicatedJob, container) for every container and init container of the runtime."""
    for rjob in replicated_jobs(runtime):
        spec = pod_spec(rjob)
        for container in [*spec.get("initContainers", []), *spec["containers"]]:
            yield rjob, container


def step_job(runtime: Obj, step: str) -> Obj:
    """The ReplicatedJob the controller finds for an ancestor step (by label, not by name)."""
    found = [rjob for rjob in replicated_jobs(runtime) if ancestor(rjob) == step]
    if len(found) != 1:
        raise KeyError(
            f"runtime {runtime['metadata']['name']} has {len(found)} ReplicatedJobs labelled "
            f"{ANCESTOR_LABEL}={step}; the controller needs exactly one"
        )
    return found[0]


def container_named(rjob: Obj, name: str) -> Obj:
    for container in containers(rjob):
        if container["name"] == name:
            return container
    raise KeyError(f"ReplicatedJob {rjob['name']} has no container named {name!r}")


def env_value(container: Obj, name: str) -> str | None:
    for var in container.get("env", []):
        if var["name"] == name:
            return var.get("value")
    return None


def mount_path(container: Obj, volume: str) -> str | None:
    for mount in container.get("volumeMounts", []):
        if mount["name"] == volume:
            return mount["mountPath"]
    return None


def volume_claim_templates(runtime: Obj) -> list[Obj]:
    policies = runtime["spec"]["template"]["spec"].get("volumeClaimPolicies", [])
    return [template for policy in policies for template in policy.get("templates", [])]

"""What the Kubeflow Trainer controller does to a runtime's containers for one TrainJob.

A transcription of the rules in ../shared/reference/kubeflow-contract.md (and of the controller's
JobSet builder they come from), for the tests that run our initializers with the env a real
cluster would give them:

* initializer containers (found by the ancestor label on the Job template and the container's
  exact name): ``storageUri`` → env ``STORAGE_URI``; ``env`` upserted by name; ``secretRef`` →
  ``envFrom.secretRef``, so every key of the Secret becomes an env var of the same name;
* trainer containers (named ``node``, in a ReplicatedJob whose Job template has labels): the
  TrainJob's ``image``, ``command`` and ``args`` replace the runtime's, ``env`` is upserted;
* admission: the storageUri pattern and length, at most 128 env items, and the initializer
  container must mount the volume named ``initializer``.

Kubernetes then resolves a container's environment with ``envFrom`` first and ``env`` on top.
"""

from __future__ import annotations

import base64
import copy
import re
from typing import Any

from tests.runtimes import manifests

STORAGE_URI_PATTERN = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://.+$")
MAX_STORAGE_URI = 2048
MAX_ENV_ITEMS = 128
STEP_FIELD = {"dataset-initializer": "dataset", "model-initializer": "model"}
TRAINER_CONTAINERS = ("node", "launcher")
Obj = dict[str, Any]
Secrets = dict[str, dict[str, str]]


class Rejected(Exception):
    """The API server or the webhook would refuse the TrainJob."""


def upsert_env(env: list[Obj], additions: list[Obj]) -> list[Obj]:
    """``env`` with each addition replacing the entry of the same name in place, or appended."""
    merged = [dict(var) for var in env]
    for var in additions:
        for index, existing in enumerate(merged):
            if existing["name"] == var["name"]:
                merged[index] = dict(var)
                break
        else:
            merged.append(dict(var))
    return merged


def validate_train_job(train_job: Obj, runtime: Obj) -> None:
    """Raise :class:`Rejected` for what API validation or the webhook refuses."""
    initializer = train_job["spec"].get("initializer") or {}
    for step, field in STEP_FIELD.items():
        spec = initializer.get(field)
        if spec is None:
            continue
        uri = spec.get("storageUri")
        if uri is not None and uri != "" and not STORAGE_URI_PATTERN.match(uri):
            raise Rejected(f"spec.initializer.{field}.storageUri {uri!r} is not a URI")
        if uri is not None and len(uri) > MAX_STORAGE_URI:
            raise Rejected(f"spec.initializer.{field}.storageUri is longer than {MAX_STORAGE_URI}")
        if len(spec.get("env", [])) > MAX_ENV_ITEMS:
            raise Rejected(f"spec.initializer.{field}.env has more than {MAX_ENV_ITEMS} items")
        try:
            container = manifests.container_named(manifests.step_job(runtime, step), step)
        except KeyError as exc:
            raise Rejected(f"runtime cannot take spec.initializer.{field}: {exc}") from None
        if manifests.mount_path(container, "initializer") is None:
            raise Rejected(f"the {step} container has no volumeMount named initializer")


def initializer_container(runtime: Obj, step: str, train_job: Obj) -> Obj:
    """The runtime's ``step`` container as the controller leaves it for ``train_job``."""
    validate_train_job(train_job, runtime)
    container = copy.deepcopy(manifests.container_named(manifests.step_job(runtime, step), step))
    spec = (train_job["spec"].get("initializer") or {}).get(STEP_FIELD[step])
    if spec is None:
        return container
    env = container.get("env", [])
    if spec.get("storageUri") is not None:
        env = upsert_env(env, [{"name": "STORAGE_URI", "value": spec["storageUri"]}])
    container["env"] = upsert_env(env, spec.get("env", []))
    if spec.get("secretRef"):
        container.setdefault("envFrom", []).append(
            {"secretRef": {"name": spec["secretRef"]["name"]}}
        )
    return container


def trainer_containers(runtime: Obj, train_job: Obj) -> list[tuple[Obj, Obj]]:
    """(ReplicatedJob, container) for each trainer container after the TrainJob's overrides."""
    trainer = train_job["spec"].get("trainer") or {}
    found = []
    for rjob in manifests.replicated_jobs(runtime):
        if not manifests.job_labels(rjob):
            continue  # the controller skips Job templates without labels (MPI sshd nodes)
        for container in manifests.containers(rjob):
            if container["name"] not in TRAINER_CONTAINERS:
                continue
            merged = copy.deepcopy(container)
            for key in ("image", "command", "args"):
                if trainer.get(key) is not None:
                    merged[key] = list(trainer[key]) if key != "image" else trainer[key]
            if trainer.get("env"):
                merged["env"] = upsert_env(merged.get("env", []), trainer["env"])
            found.append((rjob, merged))
    return found


def torch_env(runtime: Obj, train_job: Obj, node_rank: int = 0) -> dict[str, str]:
    """The PET_* variables the torch plugin sets on a trainer node (contract table)."""
    trainer = train_job["spec"].get("trainer") or {}
    name = train_job["metadata"]["name"]
    nodes = trainer.get("numNodes", runtime["spec"]["mlPolicy"].get("numNodes", 1))
    return {
        "PET_NNODES": str(nodes),
        "PET_NPROC_PER_NODE": str(trainer.get("numProcPerNode", "auto")),
        "PET_NODE_RANK": str(node_rank),
        "PET_MASTER_ADDR": f"{name}-node-0-0.{name}",
        "PET_MASTER_PORT": "29500",
    }


def resolve_env(container: Obj, secrets: Secrets) -> dict[str, str]:
    """The environment Kubernetes gives ``container``: envFrom sources, then env on top."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        name = source["secretRef"]["name"]
        if name not in secrets:
            raise Rejected(f"Secret {name!r} does not exist (the pod would not start)")
        env.update(secrets[name])
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
        elif ref := (var.get("valueFrom") or {}).get("secretKeyRef"):
            env[var["name"]] = secrets[ref["name"]][ref["key"]]
        else:
            raise ValueError(f"env {var['name']}: only value and secretKeyRef are modelled here")
    return env


def secret_data(secret: Obj) -> dict[str, str]:
    """A Secret's keys and values (stringData as written; data is base64)."""
    data = {k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()}
    data.update(secret.get("stringData") or {})
    return data

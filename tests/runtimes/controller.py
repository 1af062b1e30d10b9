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

An initializer's Job and its pods (:func:`initializer_job`, :func:`initializer_pods`) follow the
controller at kubeflow/trainer 8c0f505 and JobSet and Kubernetes as they build them:

* the pod count is the Job template's ``parallelism`` (default 1), which the controller writes
  into both ``parallelism`` and ``completions`` (``trainingruntime.go``: ``count :=
  ptr.Deref(rJob.Template.Spec.Parallelism, 1)``; ``syncParallelCount`` in the jobset plugin);
  every other Job field is copied as the runtime has it;
* JobSet's webhook defaults ``completionMode`` to ``Indexed`` and the pod's ``restartPolicy`` to
  ``OnFailure`` when the runtime leaves them unset; the Job is named
  ``<trainjob>-<replicatedJob>-0`` and its pods labelled with the JobSet's name and the
  ReplicatedJob's;
* the API server labels the Job's pods with its UID and name (``batch.kubernetes.io/
  controller-uid``, ``batch.kubernetes.io/job-name``, and the unprefixed legacy pair); an
  Indexed Job's pod ``i`` (0 to completions-1) carries ``batch.kubernetes.io/
  job-completion-index: "i"`` as an annotation and a label, and every container gets
  ``JOB_COMPLETION_INDEX`` from that annotation unless it sets the name itself;
* the kubelet resolves ``fieldRef`` env (``metadata.name``, ``namespace``, ``uid``,
  ``labels['k']``, ``annotations['k']``; an absent key gives "") from the pod.

What the Job controller does with a failed pod (:func:`pod_failure_action`) follows Kubernetes'
``podFailurePolicy`` rules as documented for batch/v1 Jobs: the rules are read in order and the
first that matches decides; ``onExitCodes`` matches a terminated container (the one named by
``containerName``, else any) whose non-zero code is ``In`` (or ``NotIn``) the values;
``onPodConditions`` matches a condition of that type and status on the pod. ``FailJob`` fails
the Job at once, ``Ignore`` replaces the pod without counting it, ``Count`` (and no match)
counts it against ``backoffLimit`` (default 6).
"""

from __future__ import annotations

import base64
import copy
import re
from typing import Any

from tests.runtimes import manifests

STORAGE_URI_PATTERN = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://.+$")
FIELD_SUBSCRIPT = re.compile(r"^metadata\.(labels|annotations)\['([^']+)'\]$")
INDEX_KEY = "batch.kubernetes.io/job-completion-index"
JOB_UID_LABELS = ("batch.kubernetes.io/controller-uid", "controller-uid")
JOB_NAME_LABELS = ("batch.kubernetes.io/job-name", "job-name")
INDEX_ENV = "JOB_COMPLETION_INDEX"
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


def resolve_env(container: Obj, secrets: Secrets, pod: Obj | None = None) -> dict[str, str]:
    """The environment Kubernetes gives ``container``: envFrom sources, then env on top; env
    from the downward API (``fieldRef``) is read from ``pod`` (see :func:`initializer_pods`)."""
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
        elif (ref := (var.get("valueFrom") or {}).get("fieldRef")) and pod is not None:
            env[var["name"]] = pod_field(pod, ref["fieldPath"])
        else:
            raise ValueError(
                f"env {var['name']}: only value, secretKeyRef and (given the pod) fieldRef "
                "are modelled here"
            )
    return env


def pod_field(pod: Obj, path: str) -> str:
    """What the downward API gives an env var for ``fieldPath`` ``path`` of ``pod``."""
    metadata = pod["metadata"]
    if match := FIELD_SUBSCRIPT.match(path):
        return (metadata.get(match[1]) or {}).get(match[2], "")
    if path in ("metadata.name", "metadata.namespace", "metadata.uid"):
        return metadata[path.removeprefix("metadata.")]
    raise ValueError(f"fieldRef {path}: not modelled here (nor valid for env in Kubernetes)")


def initializer_job(runtime: Obj, step: str, train_job: Obj) -> Obj:
    """The ``step`` initializer's Job spec as the controller and JobSet's webhook create it for
    ``train_job`` (module docstring), with its container merged (:func:`initializer_container`)."""
    rjob = manifests.step_job(runtime, step)
    spec = copy.deepcopy(rjob["template"]["spec"])
    spec["parallelism"] = spec["completions"] = spec.get("parallelism", 1)
    spec.setdefault("completionMode", "Indexed")
    pod = spec["template"]["spec"]
    pod["restartPolicy"] = pod.get("restartPolicy") or "OnFailure"
    merged = initializer_container(runtime, step, train_job)
    pod["containers"] = [merged if c["name"] == step else c for c in pod["containers"]]
    return spec


def pod_failure_action(
    job: Obj, exit_codes: dict[str, int], conditions: tuple[tuple[str, str], ...] = ()
) -> str:
    """What the Job controller does when a pod of ``job`` (a Job spec) fails with these
    containers' ``exit_codes`` and pod ``conditions`` ((type, status) pairs): ``FailJob``,
    ``Ignore`` or ``Count`` (module docstring)."""
    for rule in (job.get("podFailurePolicy") or {}).get("rules", []):
        if "onExitCodes" in rule:
            codes = rule["onExitCodes"]
            named = codes.get("containerName")
            found = [
                code for name, code in exit_codes.items() if code != 0 and named in (None, name)
            ]
            if codes["operator"] == "In":
                matched = any(code in codes["values"] for code in found)
            else:
                matched = any(code not in codes["values"] for code in found)
        else:
            wanted = {(c["type"], c.get("status", "True")) for c in rule["onPodConditions"]}
            matched = bool(wanted & set(conditions))
        if matched:
            return str(rule["action"])
    return "Count"


def initializer_pods(runtime: Obj, step: str, train_job: Obj, job_uid: str) -> list[Obj]:
    """The pods of the ``step`` initializer's Job (UID ``job_uid``) for ``train_job``, as
    Kubernetes creates them: ``{"metadata": ..., "spec": ...}``, in index order."""
    spec = initializer_job(runtime, step, train_job)
    train_job_name = (train_job.get("metadata") or {}).get("name", "trainjob")
    job_name = f"{train_job_name}-{manifests.step_job(runtime, step)['name']}-0"
    labels = {
        **((spec["template"].get("metadata") or {}).get("labels") or {}),
        "jobset.sigs.k8s.io/jobset-name": train_job_name,
        "jobset.sigs.k8s.io/replicatedjob-name": manifests.step_job(runtime, step)["name"],
        "jobset.sigs.k8s.io/job-index": "0",
        **dict.fromkeys(JOB_UID_LABELS, job_uid),
        **dict.fromkeys(JOB_NAME_LABELS, job_name),
    }
    indexed = spec["completionMode"] == "Indexed"
    pods = []
    for number in range(spec["completions"]):
        pod_spec = copy.deepcopy(spec["template"]["spec"])
        metadata: Obj = {
            "name": f"{job_name}-{number}",
            "namespace": (train_job.get("metadata") or {}).get("namespace", "default"),
            "uid": f"{job_uid}-pod-{number}",
            "labels": dict(labels),
            "annotations": {},
        }
        if indexed:
            metadata["labels"][INDEX_KEY] = metadata["annotations"][INDEX_KEY] = str(number)
            for container in [*pod_spec.get("initContainers", []), *pod_spec["containers"]]:
                if all(var["name"] != INDEX_ENV for var in container.get("env", [])):
                    container.setdefault("env", []).append({
                        "name": INDEX_ENV,
                        "valueFrom": {"fieldRef": {
                            "fieldPath": f"metadata.annotations['{INDEX_KEY}']"
                        }},
                    })  # fmt: skip
        pods.append({"metadata": metadata, "spec": pod_spec})
    return pods


def step_container(pod: Obj, step: str) -> Obj:
    """The ``step`` container of one of :func:`initializer_pods`."""
    [container] = [c for c in pod["spec"]["containers"] if c["name"] == step]
    return container


def secret_data(secret: Obj) -> dict[str, str]:
    """A Secret's keys and values (stringData as written; data is base64)."""
    data = {k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()}
    data.update(secret.get("stringData") or {})
    return data

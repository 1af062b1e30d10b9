"""The Kubeflow Trainer controller's rules hold for every runtime (../shared/reference/
kubeflow-contract.md): names and labels it looks for, the shared volume, ordering, MPI wiring,
and the resource and security settings the initializers need. Every runtime is checked as
installed, with the asset-cache component applied (runtimes/components/asset-cache), with the
sharded-dataset component (runtimes/components/sharded-dataset) and with both."""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

import pytest

from initializers.errors import ExitCode
from tests.runtimes import controller, manifests, render

PLAIN = manifests.runtimes()
VARIANTS = {
    "asset-cache": render.with_component(manifests.ASSET_CACHE_DIR),
    "sharded-dataset": render.with_sharded_dataset(),
    "asset-cache+sharded-dataset": render.with_sharded_dataset(asset_cache=True),
}
RUNTIMES = [*PLAIN, *(runtime for docs in VARIANTS.values() for runtime in docs)]
MPI_RUNTIMES = [r for r in RUNTIMES if "mpi" in r["spec"]["mlPolicy"]]
TORCH_RUNTIMES = [r for r in RUNTIMES if "torch" in r["spec"]["mlPolicy"]]


def _ids(runtimes: list[dict[str, Any]]) -> list[str]:
    variant = {id(r): f"+{name}" for name, docs in VARIANTS.items() for r in docs}
    return [r["metadata"]["name"] + variant.get(id(r), "") for r in runtimes]


IDS = _ids(RUNTIMES)
OUTPUT_PATHS = {
    "dataset-initializer": "/workspace/dataset",
    "model-initializer": "/workspace/model",
}
MEMORY_UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "": 1}

per_runtime = pytest.mark.parametrize("runtime", RUNTIMES, ids=IDS)
per_mpi_runtime = pytest.mark.parametrize("runtime", MPI_RUNTIMES, ids=_ids(MPI_RUNTIMES))
per_step = pytest.mark.parametrize("step", manifests.INITIALIZER_STEPS)


def _memory_bytes(quantity: str) -> int:
    number = quantity.rstrip("KMGTi")
    return int(float(number) * MEMORY_UNITS[quantity[len(number) :]])


def _cpu_millis(quantity: str) -> int:
    return int(quantity[:-1]) if quantity.endswith("m") else int(float(quantity) * 1000)


def _effective(pod: dict[str, Any], container: dict[str, Any], key: str) -> Any:
    """A securityContext setting as Kubernetes applies it: the container's, else the pod's."""
    value = (container.get("securityContext") or {}).get(key)
    return value if value is not None else (pod.get("securityContext") or {}).get(key)


# ---- what the controller and the webhook look for -------------------------------------------


@per_runtime
@per_step
def test_initializer_job_is_found_by_its_label_and_named_like_its_container(runtime, step):
    rjob = manifests.step_job(runtime, step)
    assert rjob["name"] == step
    assert [c["name"] for c in manifests.containers(rjob)] == [step]
    assert rjob.get("replicas", 1) == 1


@per_runtime
@per_step
def test_initializer_mounts_the_initializer_volume_at_workspace(runtime, step):
    container = manifests.container_named(manifests.step_job(runtime, step), step)
    assert manifests.mount_path(container, "initializer") == "/workspace"


@per_runtime
@per_step
def test_initializer_writes_where_the_convention_says_inside_the_shared_volume(runtime, step):
    container = manifests.container_named(manifests.step_job(runtime, step), step)
    output = manifests.env_value(container, "OUTPUT_PATH")
    assert output == OUTPUT_PATHS[step]
    assert PurePosixPath(output).is_relative_to(manifests.mount_path(container, "initializer"))


@per_runtime
def test_every_container_mounts_the_shared_volume_at_workspace(runtime):
    for rjob, container in manifests.all_containers(runtime):
        where = f"{rjob['name']}/{container['name']}"
        assert manifests.mount_path(container, "initializer") == "/workspace", where


@per_runtime
def test_shared_volume_is_a_per_trainjob_claim_template_named_initializer(runtime):
    templates = manifests.volume_claim_templates(runtime)
    assert [t["metadata"]["name"] for t in templates] == ["initializer"]
    spec = templates[0]["spec"]
    assert spec["accessModes"] and spec["resources"]["requests"]["storage"]
    assert "namespace" not in templates[0]["metadata"]
    for rjob in manifests.replicated_jobs(runtime):
        volumes = [v["name"] for v in manifests.pod_spec(rjob).get("volumes", [])]
        assert "initializer" not in volumes, f"{rjob['name']} shadows the claim template"


@per_runtime
def test_trainer_job_is_labelled_trainer_and_its_container_is_named_node(runtime):
    trainers = [r for r in manifests.replicated_jobs(runtime) if manifests.ancestor(r) == "trainer"]
    assert len(trainers) == 1
    expected = "launcher" if "mpi" in runtime["spec"]["mlPolicy"] else "node"
    assert trainers[0]["name"] == expected
    assert [c["name"] for c in manifests.containers(trainers[0])] == ["node"]


@per_runtime
def test_depends_on_names_earlier_jobs_with_a_status_jobset_knows(runtime):
    seen: list[str] = []
    for index, rjob in enumerate(manifests.replicated_jobs(runtime)):
        deps = rjob.get("dependsOn", [])
        if index == 0:
            assert not deps, "JobSet: the first ReplicatedJob cannot use dependsOn"
        names = [dep["name"] for dep in deps]
        assert len(names) == len(set(names)) and len(names) <= 5
        for dep in deps:
            assert dep["name"] in seen, f"{rjob['name']} depends on {dep['name']}, not before it"
            assert dep["status"] in ("Complete", "Ready")
        assert rjob["name"] not in seen
        seen.append(rjob["name"])


@per_runtime
def test_trainer_nodes_start_only_when_both_initializers_completed(runtime):
    node = manifests.replicated_job(runtime, "node")
    assert sorted((d["name"], d["status"]) for d in node["dependsOn"]) == [
        ("dataset-initializer", "Complete"),
        ("model-initializer", "Complete"),
    ]


# ---- launch through the shims ---------------------------------------------------------------


def test_torch_trainer_launches_through_kf_torchrun_and_sets_no_pet_env():
    container = manifests.container_named(
        manifests.replicated_job(manifests.runtime_named("torch-distributed"), "node"), "node"
    )
    assert container["command"] == ["kf-torchrun"]
    assert container.get("args"), "a default workload keeps the runtime usable without args"
    for runtime in TORCH_RUNTIMES:
        for _, trainer in controller.trainer_containers(runtime, {"spec": {}}):
            assert not [v for v in trainer.get("env", []) if v["name"].startswith("PET_")]


def test_mpi_launcher_launches_through_kf_mpirun():
    launcher = manifests.replicated_job(
        manifests.runtime_named("deepspeed-distributed"), "launcher"
    )
    container = manifests.container_named(launcher, "node")
    assert container["command"] == ["kf-mpirun"]
    assert container.get("args")


@pytest.mark.parametrize("runtime", TORCH_RUNTIMES, ids=_ids(TORCH_RUNTIMES))
def test_a_trainjob_that_sets_only_args_keeps_the_runtime_command(runtime):
    train_job = {"spec": {"trainer": {"args": ["train.py", "--epochs=1"]}}}
    [(_, trainer)] = controller.trainer_containers(runtime, train_job)
    original = manifests.container_named(manifests.replicated_job(runtime, "node"), "node")
    assert trainer["command"] == original["command"]
    assert trainer["args"] == ["train.py", "--epochs=1"]


# ---- MPI wiring -----------------------------------------------------------------------------


@per_mpi_runtime
def test_mpi_policy_is_openmpi_with_ssh_keys_in_mpiuser_home_and_launcher_as_node(runtime):
    mpi = runtime["spec"]["mlPolicy"]["mpi"]
    assert mpi["mpiImplementation"] == "OpenMPI"
    assert mpi["sshAuthMountPath"] == "/home/mpiuser/.ssh"
    assert mpi["runLauncherAsNode"] is True
    assert mpi["numProcPerNode"] >= 1


@per_mpi_runtime
def test_mpi_containers_that_get_ssh_keys_are_named_node_and_run_as_mpiuser(runtime):
    for name in ("node", "launcher"):
        rjob = manifests.replicated_job(runtime, name)
        pod = manifests.pod_spec(rjob)
        [container] = manifests.containers(rjob)
        assert container["name"] == "node"
        assert _effective(pod, container, "runAsUser") == 1000
        # The SSH Secret is mounted 0640: mpiuser reads id_rsa through the pod's fsGroup.
        assert pod["securityContext"]["fsGroup"] == 1000


@per_mpi_runtime
def test_mpi_nodes_run_sshd_on_2222_with_a_readiness_probe_and_the_launcher_waits(runtime):
    node = manifests.replicated_job(runtime, "node")
    container = manifests.container_named(node, "node")
    assert [*container["command"], *container["args"]] == [
        "/usr/sbin/sshd", "-De", "-f", "/home/mpiuser/.sshd_config",
    ]  # fmt: skip
    assert container["readinessProbe"]["tcpSocket"]["port"] == 2222
    launcher = manifests.replicated_job(runtime, "launcher")
    assert launcher["dependsOn"] == [{"name": "node", "status": "Ready"}]
    spec = runtime["spec"]["template"]["spec"]
    assert spec["network"]["publishNotReadyAddresses"] is True
    assert spec["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["launcher"]}


@per_mpi_runtime
def test_trainjob_command_never_replaces_sshd_on_the_mpi_nodes(runtime):
    node = manifests.replicated_job(runtime, "node")
    assert not manifests.job_labels(node), "a labelled Job template gets the TrainJob's command"
    train_job = {"spec": {"trainer": {"command": ["bash"], "args": ["-c", "echo"]}}}
    touched = [rjob["name"] for rjob, _ in controller.trainer_containers(runtime, train_job)]
    assert touched == ["launcher"]


# ---- resources and security -----------------------------------------------------------------


@per_runtime
@per_step
def test_initializer_asks_for_cpu_and_bounded_memory_and_no_accelerator(runtime, step):
    container = manifests.container_named(manifests.step_job(runtime, step), step)
    requests, limits = container["resources"]["requests"], container["resources"]["limits"]
    assert set(requests) == set(limits) == {"cpu", "memory"}, "CPU and memory only: no GPU"
    assert _cpu_millis(requests["cpu"]) <= _cpu_millis(limits["cpu"]) <= 4000
    assert _memory_bytes(requests["memory"]) <= _memory_bytes(limits["memory"]) <= 4 * 2**30


@per_runtime
@per_step
def test_initializer_runs_non_root_unprivileged_on_a_read_only_root(runtime, step):
    rjob = manifests.step_job(runtime, step)
    pod, container = manifests.pod_spec(rjob), manifests.container_named(rjob, step)
    assert _effective(pod, container, "runAsNonRoot") is True
    assert _effective(pod, container, "runAsUser") not in (None, 0)
    assert _effective(pod, container, "seccompProfile") == {"type": "RuntimeDefault"}
    context = container["securityContext"]
    assert context["allowPrivilegeEscalation"] is False
    assert context["readOnlyRootFilesystem"] is True
    assert context["capabilities"] == {"drop": ["ALL"]}
    # A read-only root needs somewhere to put HOME and temp files: an emptyDir at /tmp.
    tmp = manifests.mount_path(container, "tmp")
    assert tmp == "/tmp"
    [volume] = [v for v in pod["volumes"] if v["name"] == "tmp"]
    assert "emptyDir" in volume


@per_runtime
@per_step
def test_an_initializer_job_fails_after_one_pod_on_a_code_a_retry_would_repeat(runtime, step):
    """A wrong secret or a missing bucket must not keep a user waiting through every retry;
    a store down for minutes, a crash or a stop are retried by a new pod, and an evicted pod
    does not count."""
    job = controller.initializer_job(runtime, step, {"spec": {}})
    assert job["template"]["spec"]["restartPolicy"] == "Never", "what podFailurePolicy needs"
    permanent = {ExitCode.USAGE, ExitCode.AUTH, ExitCode.NOT_FOUND, ExitCode.INTEGRITY,
                 ExitCode.LOCAL_STORAGE}  # fmt: skip
    for code in ExitCode:
        if code is ExitCode.OK:
            continue
        action = controller.pod_failure_action(job, {step: code})
        assert action == ("FailJob" if code in permanent else "Count"), (code, action)
    for code in (ExitCode.UNAVAILABLE, ExitCode.INTERRUPTED, 137):
        evicted = controller.pod_failure_action(
            job, {step: code}, conditions=(("DisruptionTarget", "True"),)
        )
        assert evicted == "Ignore", code


@per_runtime
def test_every_pod_shares_one_fs_group_so_trainers_read_what_initializers_wrote(runtime):
    groups = {
        manifests.pod_spec(r)["securityContext"]["fsGroup"]
        for r in manifests.replicated_jobs(runtime)
    }
    assert len(groups) == 1


@per_runtime
def test_no_container_may_escalate_privileges(runtime):
    for rjob, container in manifests.all_containers(runtime):
        context = container.get("securityContext") or {}
        assert context.get("allowPrivilegeEscalation") is False, f"{rjob['name']}"
        assert not context.get("privileged"), f"{rjob['name']}"


# ---- the merge helper itself (so the end-to-end test rests on a checked transcription) -------


def test_controller_merge_sets_storage_uri_upserts_env_by_name_and_adds_secret_keys():
    runtime = manifests.runtime_named("torchtune-qwen2.5-1.5b")
    train_job = {
        "spec": {
            "initializer": {
                "model": {
                    "storageUri": "s3://mirror/qwen",
                    "env": [{"name": "OUTPUT_PATH", "value": "/workspace/m2"},
                            {"name": "WORKERS", "value": "4"}],
                    "secretRef": {"name": "creds"},
                }
            }
        }
    }  # fmt: skip
    container = controller.initializer_container(runtime, "model-initializer", train_job)
    secrets = {"creds": {"ACCESS_KEY_ID": "id", "SECRET_ACCESS_KEY": "key", "WORKERS": "9"}}
    env = controller.resolve_env(container, secrets)
    assert env["STORAGE_URI"] == "s3://mirror/qwen"  # the preset is replaced
    assert env["OUTPUT_PATH"] == "/workspace/m2"  # upserted by name
    assert env["ACCESS_KEY_ID"] == "id" and env["SECRET_ACCESS_KEY"] == "key"
    assert env["WORKERS"] == "4"  # an explicit env entry beats the same key from envFrom
    names = [var["name"] for var in container["env"]]
    assert len(names) == len(set(names))
    untouched = controller.initializer_container(runtime, "dataset-initializer", train_job)
    assert controller.resolve_env(untouched, {})["STORAGE_URI"] == "hf://datasets/tatsu-lab/alpaca"


@pytest.mark.parametrize(
    "uri",
    ["not a uri", "://x", "s3:/bucket", "s3://" + "a" * 2048],
    ids=["words", "no-scheme", "one-slash", "too-long"],
)
def test_controller_merge_refuses_what_api_validation_refuses(uri):
    runtime = manifests.runtime_named("torch-distributed")
    with pytest.raises(controller.Rejected):
        controller.initializer_container(
            runtime,
            "dataset-initializer",
            {"spec": {"initializer": {"dataset": {"storageUri": uri}}}},
        )

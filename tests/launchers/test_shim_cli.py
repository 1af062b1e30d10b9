"""The shims' command line and settings errors: checked before any torch or MPI is looked up.

These run in the default test suite (no torch, no MPI, no sshd needed).
"""

from __future__ import annotations

import pytest


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"PET_NNODES": "two"}, "PET_NNODES='two'"),
        ({"PET_NNODES": "2", "PET_NODE_RANK": "2", "PET_MASTER_ADDR": "m"}, "PET_NODE_RANK='2'"),
        ({"PET_NNODES": "2", "PET_NODE_RANK": "1"}, "PET_MASTER_ADDR is not set"),
        ({"PET_NNODES": "2", "PET_MASTER_ADDR": "m"}, "PET_NODE_RANK is not set"),
        ({"PET_NPROC_PER_NODE": "many"}, "PET_NPROC_PER_NODE='many'"),
        ({"PET_MASTER_PORT": "70000"}, "PET_MASTER_PORT='70000'"),
        ({"KF_WAIT_TIMEOUT": "soon"}, "KF_WAIT_TIMEOUT='soon'"),
        ({"KF_PEER_TIMEOUT": "-1"}, "KF_PEER_TIMEOUT='-1'"),
    ],
)
def test_invalid_settings_exit_2_naming_the_variable(shim, env, named):
    ran = shim("kf-torchrun", "train.py", env=env)
    assert ran.code == 2
    assert len(ran.error_lines) == 1
    assert named in ran.error_lines[0]
    assert "Traceback" not in ran.stderr


def test_no_script_exits_2_with_usage(shim):
    ran = shim("kf-torchrun", "--wait-timeout", "1")
    assert ran.code == 2
    assert "no script given; usage: kf-torchrun [options] [--] SCRIPT" in ran.error_lines[0]


@pytest.mark.parametrize("name", ["kf-torchrun", "kf-mpirun"])
def test_help_documents_flags_env_and_exit_codes(shim, name):
    ran = shim(name, "--help")
    assert ran.code == 0
    for word in (
        "--require",
        "KF_REQUIRE_ASSETS",
        "--wait-timeout",
        "KF_WAIT_TIMEOUT",
        "--peer-timeout",
        "KF_PEER_TIMEOUT",
        "4 = required assets",
        "7 = peers unreachable",
    ):
        assert word in ran.stdout


def test_torch_help_names_the_pet_settings(shim):
    ran = shim("kf-torchrun", "--help")
    for name in ("PET_NNODES", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_NPROC_PER_NODE", "auto"):
        assert name in ran.stdout


def test_mpi_help_names_the_kubeflow_and_ssh_settings(shim):
    ran = shim("kf-mpirun", "--help")
    for name in (
        "OMPI_MCA_orte_default_hostfile",
        "KF_SSH_KEY",
        "KF_SSH_PORT",
        "PRTE_MCA_",
        "runLauncherAsNode",
        "KF_MPI_IMPLEMENTATION",
    ):
        assert name in ran.stdout


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"KF_SSH_PORT": "ssh"}, "KF_SSH_PORT='ssh'"),
        ({"KF_SSH_KEY": "/no/such/id_rsa"}, "KF_SSH_KEY=/no/such/id_rsa is not a readable file"),
        ({"KF_MPI_IMPLEMENTATION": "lam"}, "KF_MPI_IMPLEMENTATION='lam' is not one of auto,"),
        ({"OMPI_MCA_orte_set_default_slots": "0"}, "OMPI_MCA_orte_set_default_slots='0'"),
        ({"KF_MPI_NP": "-4"}, "KF_MPI_NP='-4'"),
    ],
)
def test_invalid_mpi_settings_exit_2_naming_the_variable(shim, env, named):
    ran = shim("kf-mpirun", "python", "train.py", env=env)
    assert ran.code == 2
    assert len(ran.error_lines) == 1
    assert named in ran.error_lines[0]
    assert "Traceback" not in ran.stderr


def test_no_program_exits_2_with_usage(shim):
    ran = shim("kf-mpirun")
    assert ran.code == 2
    assert "no program given; usage: kf-mpirun [options] [--] PROGRAM" in ran.error_lines[0]

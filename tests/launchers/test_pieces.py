"""Specifications of the shims' small parts: CPU/GPU counting, hostfiles, MPI dialects, waits.

They read real files laid out under tmp_path (a cgroup tree as the kernel shows it, a /dev with
device nodes' names) and need neither torch nor MPI, so they run in the default test suite.
"""

from __future__ import annotations

import os
import shlex
import socket
import stat
import threading
import time
from pathlib import Path

import pytest

from initializers.cpus import available_cpus, cgroup_cpu_quota
from initializers.errors import NotFoundError, UsageError
from initializers.launchers.assets import wait_for_assets
from initializers.launchers.gpus import visible_gpus
from initializers.launchers.hostfile import Host, is_this_machine, read_hostfile, write_hostfile
from initializers.launchers.mpiimpl import Flavor, MpiInstall, build_launch, classify
from initializers.launchers.settings import SshSettings
from initializers.launchers.ssh import ssh_args, usable_key
from tests.launchers.conftest import write_complete_asset

AFFINITY = len(os.sched_getaffinity(0))


def cgroup_v2(tmp_path: Path, path: str, limits: dict[str, str]) -> tuple[Path, Path]:
    """A cgroup v2 mount under tmp_path with ``cpu.max`` per folder; returns (root, proc file)."""
    root = tmp_path / "cgroup"
    (root / path.lstrip("/")).mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpu memory\n")
    for folder, value in limits.items():
        (root / folder.lstrip("/") / "cpu.max").write_text(value + "\n")
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text(f"0::{path}\n")
    return root, proc


def test_a_cgroup_v2_quota_below_the_cores_caps_the_cpu_count(tmp_path):
    root, proc = cgroup_v2(tmp_path, "/kubepods/pod1", {"/kubepods/pod1": "100000 100000"})
    assert cgroup_cpu_quota(root, proc) == 1.0
    assert available_cpus(root, proc) == 1


def test_a_fractional_quota_rounds_up_and_never_gives_zero(tmp_path):
    root, proc = cgroup_v2(tmp_path, "/pod", {"/pod": "150000 100000"})
    assert cgroup_cpu_quota(root, proc) == 1.5
    assert available_cpus(root, proc) == min(AFFINITY, 2)
    root, proc = cgroup_v2(tmp_path / "small", "/pod", {"/pod": "10000 100000"})
    assert available_cpus(root, proc) == 1


def test_an_ancestor_quota_applies_to_the_cgroups_below_it(tmp_path):
    root, proc = cgroup_v2(
        tmp_path,
        "/kubepods/pod1/ctr",
        {"/kubepods": "100000 100000", "/kubepods/pod1/ctr": "max 100000"},
    )
    assert cgroup_cpu_quota(root, proc) == 1.0


def test_no_quota_means_the_cpus_this_process_may_run_on(tmp_path):
    root, proc = cgroup_v2(tmp_path, "/pod", {"/pod": "max 100000"})
    assert cgroup_cpu_quota(root, proc) is None
    assert available_cpus(root, proc) == AFFINITY


def test_a_cgroup_v1_cfs_quota_caps_the_cpu_count(tmp_path):
    folder = tmp_path / "cgroup" / "cpu,cpuacct" / "kubepods" / "pod1"
    folder.mkdir(parents=True)
    (folder / "cpu.cfs_quota_us").write_text("50000\n")
    (folder / "cpu.cfs_period_us").write_text("100000\n")
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text("4:memory:/kubepods/pod1\n3:cpu,cpuacct:/kubepods/pod1\n0::/\n")
    assert cgroup_cpu_quota(tmp_path / "cgroup", proc) == 0.5
    assert available_cpus(tmp_path / "cgroup", proc) == 1


def test_this_machine_cpu_count_is_at_least_one_and_at_most_its_affinity():
    assert 1 <= available_cpus() <= AFFINITY


def test_visible_gpus_follow_cuda_visible_devices_then_dev_nvidia_nodes(tmp_path):
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "null"):
        (dev / name).touch()
    assert visible_gpus({}, dev) == 2
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "3"}, dev) == 1
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "0,1,-1,2"}, dev) == 2  # CUDA stops at -1
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}, dev) == 0
    assert visible_gpus({}, tmp_path / "no-dev") == 0


def test_kubeflow_and_hydra_hostfile_lines_are_read_in_order_with_default_slots(tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(
        "# written by Kubeflow Trainer\n"
        "job-node-0-0.job slots=4\n"
        "\n"
        "job-node-0-1.job   slots=4 max_slots=8  # trailing comment\n"
        "job-node-0-2.job\n"
        "10.0.0.7:2\n"
    )
    hosts = read_hostfile(hostfile, default_slots=3)
    assert [(h.name, h.slots) for h in hosts] == [
        ("job-node-0-0.job", 4),
        ("job-node-0-1.job", 4),
        ("job-node-0-2.job", 3),
        ("10.0.0.7", 2),
    ]
    assert not any(h.local for h in hosts)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "names no host"),
        ("node-0 slots=two\n", "hostfile:1: cannot read"),
        ("node-0 slots=0\n", "hostfile:1: 'node-0 slots=0' has no slots"),
    ],
)
def test_a_hostfile_that_cannot_be_used_is_a_usage_error_naming_the_line(tmp_path, text, message):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(text)
    with pytest.raises(UsageError, match=message):
        read_hostfile(hostfile, default_slots=None)


def test_the_launcher_recognises_itself_by_short_or_qualified_hostname_only():
    me = socket.gethostname().split(".")[0]
    assert is_this_machine(f"{me}.my-trainjob")
    assert is_this_machine(me)
    assert is_this_machine("localhost")
    assert not is_this_machine("127.0.0.2")  # another "host" on loopback
    assert not is_this_machine(f"not-{me}.my-trainjob")


def test_written_hostfiles_use_the_dialect_and_localhost_for_this_machine(tmp_path):
    hosts = [Host("job-launcher-0-0.job", 2, local=True), Host("job-node-0-0.job", 2)]
    write_hostfile(hosts, tmp_path / "ompi", hydra=False)
    write_hostfile(hosts, tmp_path / "hydra", hydra=True)
    assert (tmp_path / "ompi").read_text() == "localhost slots=2\njob-node-0-0.job slots=2\n"
    assert (tmp_path / "hydra").read_text() == "localhost:2\njob-node-0-0.job:2\n"


@pytest.mark.parametrize(
    ("text", "flavor", "version"),
    [
        ("mpirun (Open MPI) 5.0.11\n\nReport bugs to ...", Flavor.OPENMPI5, "5.0.11"),
        ("mpirun.openmpi (OpenRTE) 4.1.4\n", Flavor.OPENMPI4, "4.1.4"),
        ("HYDRA build details:\n    Version:        4.0.2\n", Flavor.MPICH, "4.0.2"),
        ("Intel(R) MPI Library for Linux* OS, Version 2021.10 Build", Flavor.MPICH, "2021.10"),
    ],
)
def test_the_mpi_is_told_from_what_mpirun_version_prints(text, flavor, version):
    assert classify(text, "mpirun") == (flavor, version)


def test_an_unknown_mpirun_is_a_usage_error_saying_how_to_choose(tmp_path):
    with pytest.raises(UsageError, match="set KF_MPI_IMPLEMENTATION to openmpi4, openmpi5"):
        classify("some other launcher 1.0", "mpirun")


def launch(flavor: Flavor, tmp_path: Path, **env: str):
    return build_launch(
        MpiInstall(flavor, "x", "/opt/mpi/bin/mpirun"),
        hostfile=tmp_path / "hostfile",
        np=8,
        ssh_args=["-p", "2222", "-i", "/keys/id_rsa"],
        keep_fqdn=True,
        as_root=False,
        scratch=tmp_path,
        env={"PATH": "/opt/mpi/bin:/usr/bin", **env},
        command=["python", "train.py", "--lr", "1"],
    )


def test_open_mpi_4_gets_ssh_args_as_omp_mca_plm_rsh_args(tmp_path):
    got = launch(Flavor.OPENMPI4, tmp_path, OMPI_MCA_orte_default_hostfile="/etc/mpi/hostfile")
    assert got.env_changes == {
        "OMPI_MCA_plm_rsh_args": "-p 2222 -i /keys/id_rsa",
        "OMPI_MCA_orte_default_hostfile": str(tmp_path / "hostfile"),
    }
    assert got.argv == [
        "/opt/mpi/bin/mpirun", "--hostfile", str(tmp_path / "hostfile"), "-np", "8",
        "-x", "PATH", "python", "train.py", "--lr", "1",
    ]  # fmt: skip


def test_open_mpi_5_gets_the_prte_names_it_reads_instead_of_the_ignored_ompi_ones(tmp_path):
    got = launch(Flavor.OPENMPI5, tmp_path, LD_LIBRARY_PATH="/opt/mpi/lib")
    assert got.env_changes == {
        "PRTE_MCA_plm_ssh_args": "-p 2222 -i /keys/id_rsa",
        "PRTE_MCA_prte_keep_fqdn_hostnames": "1",
    }
    assert got.argv[-8:] == [
        "-x",
        "PATH",
        "-x",
        "LD_LIBRARY_PATH",
        "python",
        "train.py",
        "--lr",
        "1",
    ]


def test_hydra_gets_a_host_n_file_and_an_ssh_wrapper_carrying_the_ssh_args(tmp_path):
    got = launch(Flavor.MPICH, tmp_path)
    wrapper = tmp_path / "ssh"
    assert got.env_changes == {}
    assert got.argv == [
        "/opt/mpi/bin/mpirun", "-np", "8", "-f", str(tmp_path / "hostfile"),
        "-launcher", "ssh", "-launcher-exec", str(wrapper), "python", "train.py", "--lr", "1",
    ]  # fmt: skip
    assert wrapper.read_text() == '#!/bin/sh\nexec ssh -p 2222 -i /keys/id_rsa "$@"\n'
    assert wrapper.stat().st_mode & stat.S_IXUSR


def test_ssh_args_keep_kubeflow_connection_attempts_and_never_prompt():
    args = ssh_args(SshSettings(2222, Path("/k/id_rsa"), ("-o", "ConnectionAttempts=10")), None)
    line = shlex.join(args)
    assert line.startswith("-p 2222 -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null")
    assert "BatchMode=yes" in line
    assert line.endswith("-o ConnectionAttempts=10")


def test_a_key_others_may_read_is_copied_private_and_a_private_one_used_as_is(tmp_path):
    key = tmp_path / "id_rsa"
    key.write_text("PRIVATE KEY")
    key.chmod(0o640)  # how Kubeflow mounts the Secret
    copy = usable_key(key, tmp_path)
    assert copy != key
    assert copy.read_text() == "PRIVATE KEY"
    assert stat.S_IMODE(copy.stat().st_mode) == 0o600
    key.chmod(0o600)
    assert usable_key(key, tmp_path) == key


def test_assets_wait_returns_as_soon_as_the_manifest_lands(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    timer = threading.Timer(0.5, write_complete_asset, (model, {"w.safetensors": b"w" * 10}))
    started = time.monotonic()
    timer.start()
    try:
        (asset,) = wait_for_assets([model], timeout=30)
    finally:
        timer.cancel()
    assert 0.4 < time.monotonic() - started < 10
    assert (asset.files, asset.total_bytes, asset.source) == (1, 10, "s3://b/m")


def test_assets_wait_gives_up_after_its_timeout_with_not_found(tmp_path):
    started = time.monotonic()
    with pytest.raises(NotFoundError, match="required assets not complete after 1s"):
        wait_for_assets([tmp_path], timeout=1)
    assert 1 <= time.monotonic() - started < 5

"""``kf-mpirun``: an mpirun that reads Kubeflow's hostfile and SSH setup, and waits for the nodes.

On the launcher: ``command: [kf-mpirun, --require, /workspace/model, python, train.py]``. It reads
the hostfile (``--hostfile``, ``OMPI_MCA_orte_default_hostfile``, else /etc/mpi/hostfile), waits
until every node's sshd answers, detects the installed MPI and passes the Kubeflow settings in the
form it reads (Open MPI 4: OMPI_MCA_*; Open MPI 5: PRTE_MCA_*; MPICH: -f and an ssh wrapper), then
execs mpirun with one process per slot.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

from initializers.cpus import available_cpus
from initializers.environment import variables
from initializers.launchers import settings as config
from initializers.launchers.assets import wait_for_assets
from initializers.launchers.hostfile import Host, read_hostfile, write_hostfile
from initializers.launchers.mpiimpl import Flavor, MpiInstall, build_launch, detect
from initializers.launchers.netwait import Endpoint, wait_for_endpoints
from initializers.launchers.shim import (
    exec_launcher,
    log,
    new_parser,
    run,
    show_command,
    user_command,
)
from initializers.launchers.ssh import ssh_args, usable_key

PROG = "kf-mpirun"
DESCRIPTION = (
    "mpirun for a Kubeflow Trainer MPI launcher: reads the hostfile and SSH settings, waits for\n"
    "every node's sshd and for complete assets, then execs the installed mpirun."
)
EPILOG = """
Kubeflow's MPI plugin sets OMPI_MCA_orte_default_hostfile, OMPI_MCA_orte_set_default_slots (the
slots of a hostfile line that names none), OMPI_MCA_orte_keep_fqdn_hostnames and
OMPI_MCA_plm_rsh_args (kept, appended to the ssh options) on the launcher. They are passed on in
the form the installed MPI reads: Open MPI 4 OMPI_MCA_*, Open MPI 5 PRTE_MCA_*, MPICH/Hydra a
host:N file and an ssh wrapper. runLauncherAsNode: a hostfile line naming this pod (its
hostname, short or qualified) starts its ranks here, without SSH.

examples:
  kf-mpirun --require /workspace/model python train.py --epochs 3
  kf-mpirun -- --bind-to none python train.py   (mpirun options go after --, before the program)
"""


def build_parser() -> argparse.ArgumentParser:
    parser = new_parser(PROG, DESCRIPTION, EPILOG)
    add = parser.add_argument
    add(
        "--hostfile",
        metavar="PATH",
        help="the hostfile (OMPI_MCA_orte_default_hostfile; default /etc/mpi/hostfile; with no "
        "hostfile at all the ranks run on this machine only)",
    )
    add("--np", type=int, metavar="N", help="processes (KF_MPI_NP; default: the hostfile's slots)")
    add("--ssh-port", type=int, metavar="N", help="nodes' sshd port (KF_SSH_PORT; default 2222)")
    add(
        "--ssh-key",
        metavar="PATH",
        help="private key of the job's SSH Secret (KF_SSH_KEY; default: the first of "
        + ", ".join(config.SSH_KEY_CANDIDATES)
        + ")",
    )
    add("--mpirun", metavar="PATH", help="the mpirun to exec (KF_MPIRUN; default: on PATH)")
    add(
        "--mpi",
        metavar="NAME",
        help=f"{'|'.join(config.MPI_IMPLEMENTATIONS)} (KF_MPI_IMPLEMENTATION; default auto: "
        "from mpirun --version)",
    )
    return parser


def describe(
    install: MpiInstall, mpi: config.MpiSettings, hosts: list[Host], np: int, waited: bool
) -> None:
    log.info("%s %s at %s", install.flavor.label, install.version, install.mpirun)
    if not hosts:
        log.info("no hostfile: %d process(es) on this machine only", np)
        return
    slots = sum(h.slots for h in hosts)
    log.info(
        "hostfile %s (%s): %d host(s), %d slot(s), %d process(es)",
        mpi.hostfile,
        mpi.hostfile_source,
        len(hosts),
        slots,
        np,
    )
    width = max(len(h.name) for h in hosts)
    for host in hosts:
        where = (
            "this launcher (runLauncherAsNode): ranks start here, no SSH"
            if host.local
            else f"sshd on port {mpi.ssh.port}" + (" answering" if waited else "")
        )
        log.info("  %-*s  slots=%-3d %s", width, host.name, host.slots, where)


def _body(argv: list[str] | None) -> int:
    parsed = build_parser().parse_args(argv)
    env = variables()
    command = user_command(parsed, PROG, "program")
    waits = config.wait_settings(parsed, env)
    mpi = config.mpi_settings(parsed, env)
    install = detect(mpi.mpirun, mpi.implementation)
    hosts = read_hostfile(mpi.hostfile, mpi.default_slots) if mpi.hostfile else []
    np = mpi.np or (sum(h.slots for h in hosts) if hosts else available_cpus())

    if not parsed.dry_run:
        wait_for_assets(waits.require, waits.timeout)
        sshd = [
            Endpoint(h.name, mpi.ssh.port, role="sshd", banner=b"SSH-")
            for h in hosts
            if not h.local
        ]
        wait_for_endpoints(sshd, waits.peer_timeout, what=f"sshd on {len(sshd)} node(s)")

    # Files handed to mpirun (translated hostfile, private key copy, Hydra's ssh wrapper) must
    # outlive this process, which becomes mpirun: they stay in a private temp folder.
    scratch = Path(tempfile.mkdtemp(prefix="kf-mpirun-"))
    hostfile = mpi.hostfile
    hydra = install.flavor is Flavor.MPICH
    if hosts and (hydra or any(h.local for h in hosts)):
        hostfile = scratch / "hostfile"
        write_hostfile(hosts, hostfile, hydra=hydra)
    key = usable_key(mpi.ssh.key, scratch) if hosts else None
    launch = build_launch(
        install,
        hostfile=hostfile,
        np=np,
        ssh_args=ssh_args(mpi.ssh, key),
        keep_fqdn=mpi.keep_fqdn,
        as_root=os.geteuid() == 0,
        scratch=scratch,
        env=env,
        command=command,
    )
    describe(install, mpi, hosts, np, waited=not parsed.dry_run)
    if hosts:
        copied = " (readable by others: using a private copy)" if key != mpi.ssh.key else ""
        log.info("ssh port %d, key %s%s", mpi.ssh.port, mpi.ssh.key or "(ssh defaults)", copied)
    show_command(launch.argv, launch.env_changes)
    if parsed.dry_run:
        shutil.rmtree(scratch)
        log.info("dry run: not waiting, not launching")
        return 0
    exec_launcher(launch.argv, {**env, **launch.env_changes})


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``kf-mpirun`` console script."""
    return run(PROG, lambda: _body(argv))


if __name__ == "__main__":
    sys.exit(main())

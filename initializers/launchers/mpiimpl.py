"""Which MPI is installed, and how each one wants Kubeflow's settings said.

Kubeflow's MPI plugin speaks Open MPI 4 (``OMPI_MCA_orte_*``, ``OMPI_MCA_plm_rsh_args``). Open MPI 5
launches through PRRTE, which ignores those names and reads ``PRTE_MCA_*``; MPICH's Hydra (and
Intel MPI, built on it) reads neither: it takes ``-f host:N`` files and an ssh program to exec.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from initializers.errors import UsageError

VERSION_TIMEOUT = 30.0
_OPEN_MPI = re.compile(r"\((?:Open MPI|OpenRTE)\)\s+(?P<version>(?P<major>\d+)\.\d+[.\w]*)")
_HYDRA = re.compile(r"HYDRA build details:.*?Version:\s*(?P<version>\S+)", re.S)
_INTEL = re.compile(r"Intel\(R\) MPI Library.*?Version (?P<version>[\d.]+)", re.S)


class Flavor(StrEnum):
    OPENMPI4 = "openmpi4"  # ORTE: Open MPI up to 4.x
    OPENMPI5 = "openmpi5"  # PRRTE: Open MPI 5 and later
    MPICH = "mpich"  # Hydra: MPICH, Intel MPI, MVAPICH

    @property
    def label(self) -> str:
        return {"openmpi4": "Open MPI (ORTE)", "openmpi5": "Open MPI (PRRTE)"}.get(
            self.value, "MPICH/Hydra"
        )


@dataclass(frozen=True)
class MpiInstall:
    flavor: Flavor
    version: str
    mpirun: str  # absolute: Open MPI then uses its prefix on the remote nodes too


def detect(mpirun: str, override: str = "auto") -> MpiInstall:
    """Find ``mpirun`` and tell which MPI it belongs to from ``mpirun --version``."""
    found = shutil.which(mpirun)
    if not found:
        raise UsageError(f"{mpirun!r} not found on PATH; use an image with MPI or set KF_MPIRUN")
    if override != "auto":
        return MpiInstall(Flavor(override), "(set by --mpi/KF_MPI_IMPLEMENTATION)", found)
    try:
        done = subprocess.run(
            [found, "--version"],
            capture_output=True,
            text=True,
            timeout=VERSION_TIMEOUT,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UsageError(f"'{found} --version' failed ({exc}); set KF_MPI_IMPLEMENTATION") from None
    return MpiInstall(*classify(done.stdout + done.stderr, found), found)


def classify(version_text: str, mpirun: str) -> tuple[Flavor, str]:
    """(flavor, version) from the text ``mpirun --version`` printed."""
    if match := _OPEN_MPI.search(version_text):
        major = int(match["major"])
        return (Flavor.OPENMPI5 if major >= 5 else Flavor.OPENMPI4), match["version"]
    if match := _HYDRA.search(version_text) or _INTEL.search(version_text):
        return Flavor.MPICH, match["version"]
    first = version_text.strip().splitlines()[:1] or ["nothing"]
    raise UsageError(
        f"cannot tell which MPI {mpirun} is ('--version' said {first[0]!r}); "
        "set KF_MPI_IMPLEMENTATION to openmpi4, openmpi5 or mpich"
    )


@dataclass(frozen=True)
class Launch:
    """The exact mpirun command and the env variables the shim adds for it."""

    argv: list[str]
    env_changes: dict[str, str]


def build_launch(
    install: MpiInstall,
    *,
    hostfile: Path | None,
    np: int,
    ssh_args: Sequence[str],
    keep_fqdn: bool,
    as_root: bool,
    scratch: Path,
    env: Mapping[str, str],
    command: Sequence[str],
) -> Launch:
    """Say the Kubeflow settings the way ``install`` understands them."""
    ssh_line = shlex.join(ssh_args)
    if install.flavor is Flavor.MPICH:
        argv = [install.mpirun, "-np", str(np)]
        if hostfile is not None:
            wrapper = scratch / "ssh"
            wrapper.write_text(f'#!/bin/sh\nexec ssh {ssh_line} "$@"\n')
            wrapper.chmod(0o755)
            argv += ["-f", str(hostfile), "-launcher", "ssh", "-launcher-exec", str(wrapper)]
        return Launch([*argv, *command], {})

    argv = [install.mpirun]
    if as_root:
        argv.append("--allow-run-as-root")
    changes: dict[str, str] = {}
    if hostfile is not None:
        argv += ["--hostfile", str(hostfile)]
        if install.flavor is Flavor.OPENMPI4:
            changes["OMPI_MCA_plm_rsh_args"] = ssh_line
            if env.get("OMPI_MCA_orte_default_hostfile"):  # keep it naming the file we pass
                changes["OMPI_MCA_orte_default_hostfile"] = str(hostfile)
        else:
            changes["PRTE_MCA_plm_ssh_args"] = ssh_line
            if keep_fqdn:
                changes["PRTE_MCA_prte_keep_fqdn_hostnames"] = "1"
    argv += ["-np", str(np)]
    # Remote ranks start from sshd's minimal environment: give them the launcher's PATH.
    for name in ("PATH", "LD_LIBRARY_PATH"):
        if env.get(name):
            argv += ["-x", name]
    return Launch([*argv, *command], changes)

"""Flags and environment, parsed once into typed settings for the shims (flags beat env).

Names follow the contract: ``PET_*`` come from Kubeflow Trainer's torch plugin; the hostfile and
``OMPI_MCA_*`` from its MPI plugin; ``KF_*`` configure the shims themselves. Every bad value
becomes a UsageError naming the variable, its value and the fix.
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from initializers.environment import is_on
from initializers.errors import UsageError

DEFAULT_WAIT_TIMEOUT = 600.0
DEFAULT_MASTER_PORT = 29500
DEFAULT_SSH_PORT = 2222
DEFAULT_HOSTFILE = Path("/etc/mpi/hostfile")
NPROC_WORDS = ("auto", "cpu", "gpu")
MPI_IMPLEMENTATIONS = ("auto", "openmpi4", "openmpi5", "mpich")
# Where Kubeflow runtimes mount the SSH Secret (sshAuthMountPath); the first key found is used.
SSH_KEY_CANDIDATES = ("~/.ssh/id_rsa", "/home/mpiuser/.ssh/id_rsa", "/root/.ssh/id_rsa")
_PET_HINT = "PET_* are set by the Kubeflow Trainer controller; do not override them in the TrainJob"


def _whole(value: str, name: str, low: int, high: int | None = None, hint: str = "") -> int:
    try:
        number = int(value.strip())
    except ValueError:
        number = None
    if number is None or number < low or (high is not None and number > high):
        bounds = f"{low}..{high}" if high is not None else f">= {low}"
        raise UsageError(f"{name}={value!r} is not a whole number {bounds}{hint}")
    return number


def _pick(flag: object, env: Mapping[str, str], *names: str) -> tuple[str, str] | None:
    """(source name, value) of the flag when given, else of the first env var set non-empty."""
    if flag is not None:
        return "flag", str(flag)
    for name in names:
        if env.get(name, "").strip():
            return name, env[name].strip()
    return None


@dataclass(frozen=True)
class WaitSettings:
    """What must be ready before launch, and for how long to wait for it."""

    require: tuple[Path, ...]
    timeout: float  # for the assets
    peer_timeout: float  # for the torch master / every node's sshd


def wait_settings(parsed: argparse.Namespace, env: Mapping[str, str]) -> WaitSettings:
    if parsed.require:
        require = tuple(Path(p) for p in parsed.require)
    else:
        raw = env.get("KF_REQUIRE_ASSETS", "")
        require = tuple(Path(p.strip()) for p in raw.split(",") if p.strip())
    return WaitSettings(
        require,
        _seconds(_pick(parsed.wait_timeout, env, "KF_WAIT_TIMEOUT"), "--wait-timeout"),
        _seconds(_pick(parsed.peer_timeout, env, "KF_PEER_TIMEOUT"), "--peer-timeout"),
    )


def _seconds(picked: tuple[str, str] | None, flag: str) -> float:
    if picked is None:
        return DEFAULT_WAIT_TIMEOUT
    source, value = picked
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds < float("inf"):
        raise UsageError(f"{_label(source, flag)}={value!r} is not a number of seconds >= 0")
    return seconds


@dataclass(frozen=True)
class TorchSettings:
    """The torch plugin's contract; all defaults describe a single node with no PET_* set."""

    nnodes: int
    nproc: str  # a whole number as text, or one of NPROC_WORDS
    node_rank: int
    master_addr: str | None
    master_port: int
    launcher: str | None  # --torchrun / KF_TORCHRUN; None = torchrun on PATH


def torch_settings(parsed: argparse.Namespace, env: Mapping[str, str]) -> TorchSettings:
    hint = f"; {_PET_HINT}"
    nnodes = _whole(env.get("PET_NNODES", "1"), "PET_NNODES", 1, hint=hint)
    nproc = env.get("PET_NPROC_PER_NODE", "auto").strip().lower() or "auto"
    if nproc not in NPROC_WORDS:
        _whole(nproc, "PET_NPROC_PER_NODE", 1, hint=f" or one of {', '.join(NPROC_WORDS)}{hint}")
    if "PET_NODE_RANK" in env:
        node_rank = _whole(env["PET_NODE_RANK"], "PET_NODE_RANK", 0, nnodes - 1, hint=hint)
    elif nnodes > 1:
        raise UsageError(f"PET_NNODES={nnodes} but PET_NODE_RANK is not set{hint}")
    else:
        node_rank = 0
    master_addr = env.get("PET_MASTER_ADDR", "").strip() or None
    if nnodes > 1 and master_addr is None:
        raise UsageError(f"PET_NNODES={nnodes} but PET_MASTER_ADDR is not set{hint}")
    port = env.get("PET_MASTER_PORT", str(DEFAULT_MASTER_PORT))
    master_port = _whole(port, "PET_MASTER_PORT", 1, 65535, hint=hint)
    launcher = _pick(parsed.torchrun, env, "KF_TORCHRUN")
    return TorchSettings(
        nnodes, nproc, node_rank, master_addr, master_port, launcher[1] if launcher else None
    )


@dataclass(frozen=True)
class SshSettings:
    """How mpirun reaches the nodes' sshd (Kubeflow: port 2222, key from the mounted Secret)."""

    port: int
    key: Path | None
    extra_args: tuple[str, ...]  # OMPI_MCA_plm_rsh_args as Kubeflow set it, kept


@dataclass(frozen=True)
class MpiSettings:
    hostfile: Path | None  # None: no hostfile anywhere, run on this machine only
    hostfile_source: str
    default_slots: int | None
    keep_fqdn: bool
    ssh: SshSettings
    mpirun: str
    implementation: str
    np: int | None


def mpi_settings(parsed: argparse.Namespace, env: Mapping[str, str]) -> MpiSettings:
    hostfile_pick = _pick(
        parsed.hostfile, env, "OMPI_MCA_orte_default_hostfile", "PRTE_MCA_prte_default_hostfile"
    )
    if hostfile_pick:
        source, value = hostfile_pick
        hostfile: Path | None = Path(value)
        source = "--hostfile" if source == "flag" else source
    else:
        source = "default"
        hostfile = DEFAULT_HOSTFILE if DEFAULT_HOSTFILE.exists() else None
    slots = env.get("OMPI_MCA_orte_set_default_slots", "").strip()
    default_slots = _whole(slots, "OMPI_MCA_orte_set_default_slots", 1) if slots else None
    keep_fqdn = is_on(env, "OMPI_MCA_orte_keep_fqdn_hostnames")

    port_pick = _pick(parsed.ssh_port, env, "KF_SSH_PORT")
    port = DEFAULT_SSH_PORT
    if port_pick:
        port = _whole(port_pick[1], _label(port_pick[0], "--ssh-port"), 1, 65535)
    key_pick = _pick(parsed.ssh_key, env, "KF_SSH_KEY")
    if key_pick:
        key: Path | None = Path(key_pick[1])
        if not _is_file(key):
            where = _label(key_pick[0], "--ssh-key")
            raise UsageError(f"{where}={key} is not a readable file; point it at the private key")
    else:
        found = (Path(c).expanduser() for c in SSH_KEY_CANDIDATES)
        key = next((c for c in found if _is_file(c)), None)
    try:
        extra = tuple(shlex.split(env.get("OMPI_MCA_plm_rsh_args", "")))
    except ValueError as exc:
        raise UsageError(f"OMPI_MCA_plm_rsh_args cannot be parsed ({exc})") from None

    impl_pick = _pick(parsed.mpi, env, "KF_MPI_IMPLEMENTATION")
    implementation = impl_pick[1].lower() if impl_pick else "auto"
    if implementation not in MPI_IMPLEMENTATIONS:
        where = _label(impl_pick[0] if impl_pick else "", "--mpi")
        choices = ", ".join(MPI_IMPLEMENTATIONS)
        raise UsageError(f"{where}={implementation!r} is not one of {choices}")
    np_pick = _pick(parsed.np, env, "KF_MPI_NP")
    np = _whole(np_pick[1], _label(np_pick[0], "--np"), 1) if np_pick else None
    mpirun_pick = _pick(parsed.mpirun, env, "KF_MPIRUN")
    return MpiSettings(
        hostfile=hostfile,
        hostfile_source=source,
        default_slots=default_slots,
        keep_fqdn=keep_fqdn,
        ssh=SshSettings(port, key, extra),
        mpirun=mpirun_pick[1] if mpirun_pick else "mpirun",
        implementation=implementation,
        np=np,
    )


def _label(source: str, flag: str) -> str:
    return flag if source == "flag" else source


def _is_file(path: Path) -> bool:
    """True for a regular file; False also where a folder on the way may not be searched
    (a non-root user probing /root/.ssh), which Python 3.11's is_file raises for."""
    try:
        return path.is_file()
    except OSError:
        return False

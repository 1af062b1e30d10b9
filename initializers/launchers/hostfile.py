"""The MPI hostfile: read Kubeflow's (``<host> slots=N`` per line), write what an MPI reads.

Kubeflow's MPI plugin writes Open MPI's format; MPICH/Hydra wants ``<host>:N``. Both are read
(plus comments and blank lines). With runLauncherAsNode the launcher itself is listed: it is
recognised by name, and written as ``localhost`` so mpirun starts its ranks without SSH.
"""

from __future__ import annotations

import functools
import ipaddress
import re
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from initializers.errors import UsageError

_OPENMPI_LINE = re.compile(r"(?P<host>[^\s:#]+)(?P<opts>(?:\s+\w+\s*=\s*\d+)*)\s*")
_HYDRA_LINE = re.compile(r"(?P<host>[^\s:#]+):(?P<slots>\d+)\s*")
_LOCAL_NAMES = ("localhost", "127.0.0.1", "::1")


@dataclass(frozen=True)
class Host:
    name: str
    slots: int
    local: bool = False  # this machine (runLauncherAsNode): no SSH to it


def read_hostfile(path: Path, default_slots: int | None) -> list[Host]:
    """Hosts in file order; a line without slots gets ``default_slots`` (else 1)."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise UsageError(
            f"cannot read hostfile {path} ({exc.strerror}); on the launcher Kubeflow mounts it "
            "at /etc/mpi/hostfile: check the runtime's MPI policy, or pass --hostfile"
        ) from None
    hosts = [
        host
        for number, line in enumerate(text.splitlines(), 1)
        if (host := _parse_line(line, number, path, default_slots or 1))
    ]
    if not hosts:
        raise UsageError(f"hostfile {path} names no host; expected lines like 'node-0 slots=2'")
    return hosts


def _parse_line(line: str, number: int, path: Path, default_slots: int) -> Host | None:
    line = line.split("#", 1)[0].strip()
    if not line:
        return None
    if match := _HYDRA_LINE.fullmatch(line):
        slots = int(match["slots"])
    elif match := _OPENMPI_LINE.fullmatch(line):
        opts = dict(re.findall(r"(\w+)\s*=\s*(\d+)", match["opts"]))
        slots = int(opts.get("slots", default_slots))
    else:
        raise UsageError(f"{path}:{number}: cannot read {line!r}; expected '<host> slots=<N>'")
    if slots < 1:
        raise UsageError(f"{path}:{number}: {line!r} has no slots; expected slots >= 1")
    return Host(match["host"], slots, local=is_this_machine(match["host"]))


def is_this_machine(name: str) -> bool:
    """True when ``name`` is this launcher: localhost, or its hostname (short or qualified).

    Kubeflow lists the launcher as ``<job>-launcher-0-0.<job>``, and the pod's hostname is
    ``<job>-launcher-0-0``. Addresses are compared literally (127.0.0.2 is another "host").
    """
    if name in _LOCAL_NAMES:
        return True
    try:
        ipaddress.ip_address(name)
        return False
    except ValueError:
        pass
    mine = _my_names()
    return name in mine or name.split(".", 1)[0] in {m.split(".", 1)[0] for m in mine}


@functools.cache
def _my_names() -> frozenset[str]:
    return frozenset({socket.gethostname(), socket.getfqdn()})


def write_hostfile(hosts: Sequence[Host], path: Path, hydra: bool) -> None:
    """Write ``hosts`` in the format the MPI reads, the local one as ``localhost``."""
    lines = []
    for host in hosts:
        name = "localhost" if host.local else host.name
        lines.append(f"{name}:{host.slots}" if hydra else f"{name} slots={host.slots}")
    path.write_text("\n".join(lines) + "\n")

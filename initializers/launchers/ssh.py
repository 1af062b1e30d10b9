"""The ssh command line mpirun should use to reach Kubeflow's nodes.

Nodes run sshd on port 2222 with the job's key pair from a Secret mounted at sshAuthMountPath
(``id_rsa``, mode 0640). Host keys change with every pod, so host-key checking is off and nothing
is written to known_hosts; BatchMode makes a rejected key fail fast instead of asking.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path

from initializers.errors import UsageError
from initializers.launchers.settings import SshSettings

FIXED_OPTIONS = (
    "-o",
    "StrictHostKeyChecking=no",
    "-o",
    "UserKnownHostsFile=/dev/null",
    "-o",
    "LogLevel=ERROR",
    "-o",
    "BatchMode=yes",
)


def ssh_args(settings: SshSettings, key: Path | None) -> list[str]:
    """Arguments for ``ssh`` (without the program name or host)."""
    args = ["-p", str(settings.port)]
    if key is not None:
        args += ["-i", str(key)]
    return [*args, *FIXED_OPTIONS, *settings.extra_args]


def usable_key(key: Path | None, scratch: Path) -> Path | None:
    """``key``, or a private 0600 copy of it when ssh would refuse it as too open.

    ssh ignores a key we own that others may read; a Secret mounted with mode 0640 for a root
    container is exactly that. The copy lives in ``scratch``, next to the other files the shim
    hands to mpirun.
    """
    if key is None:
        return None
    try:
        info = key.stat()
    except OSError as exc:
        raise UsageError(f"SSH key {key} cannot be read ({exc.strerror})") from None
    if info.st_uid != os.geteuid() or not info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        return key
    fd, name = tempfile.mkstemp(prefix="id_", dir=scratch)
    with os.fdopen(fd, "wb") as out, key.open("rb") as src:
        shutil.copyfileobj(src, out)
    return Path(name)

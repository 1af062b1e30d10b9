"""How many CPUs this container may really use: affinity, capped by the cgroup CPU quota.

``os.cpu_count()`` reports the host's cores, so a pod limited to 2 CPUs on a 64-core node would
start 64 processes. The quota (cgroup v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``/``cfs_period_us``)
is rounded up, as the JVM and loky do: a 1.5-CPU limit runs 2 processes, never 0.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_SELF_CGROUP = Path("/proc/self/cgroup")


def available_cpus(
    cgroup_root: Path = CGROUP_ROOT, proc_self_cgroup: Path = PROC_SELF_CGROUP
) -> int:
    """CPUs this process may use (at least 1)."""
    count = len(os.sched_getaffinity(0))
    quota = cgroup_cpu_quota(cgroup_root, proc_self_cgroup)
    if quota is not None:
        count = min(count, math.ceil(quota))
    return max(1, count)


def cgroup_cpu_quota(cgroup_root: Path, proc_self_cgroup: Path) -> float | None:
    """The tightest CPU quota on this process's cgroup and its ancestors, in CPUs; None if none."""
    try:
        lines = proc_self_cgroup.read_text().splitlines()
    except OSError:
        return None
    quotas: list[float] = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # cgroup v2 unified hierarchy: "0::/path"
            unified = (cgroup_root / "cgroup.controllers").exists()
            base = cgroup_root if unified else cgroup_root / "unified"  # v2, or hybrid
            quotas += [q for d in _dirs(base, path) if (q := _v2_quota(d)) is not None]
        elif "cpu" in controllers.split(","):  # cgroup v1: "N:cpu,cpuacct:/path"
            for mount in (cgroup_root / controllers, cgroup_root / "cpu"):
                if mount.is_dir():
                    quotas += [q for d in _dirs(mount, path) if (q := _v1_quota(d)) is not None]
                    break
    return min(quotas, default=None)


def _dirs(mount: Path, path: str) -> list[Path]:
    """The cgroup folder and its ancestors up to the mount (the mount alone if not visible)."""
    folder = mount / path.lstrip("/")
    if not folder.is_dir():  # no cgroup namespace view: the mount root is our own cgroup
        return [mount]
    found = [folder]
    while folder != mount:
        folder = folder.parent
        found.append(folder)
    return found


def _v2_quota(folder: Path) -> float | None:
    try:
        quota, period = (folder / "cpu.max").read_text().split()
    except (OSError, ValueError):
        return None
    return None if quota == "max" else int(quota) / int(period)


def _v1_quota(folder: Path) -> float | None:
    try:
        quota = int((folder / "cpu.cfs_quota_us").read_text())
        period = int((folder / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return None if quota <= 0 or period <= 0 else quota / period

"""podman as the image tests run it: with the project's containers.conf (runc, cgroupfs, limits;
see images/README.md), failing the test with podman's own words when a command fails."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

CONTAINERS_CONF = Path(__file__).resolve().parents[1] / "images" / "podman" / "containers.conf"


def podman_env() -> dict[str, str]:
    return {**os.environ, "CONTAINERS_CONF": str(CONTAINERS_CONF)}


def podman(*args: str, timeout: float = 180, check: bool = True) -> subprocess.CompletedProcess:
    """Run ``podman ARGS``; with ``check``, a failure fails the test with podman's stderr."""
    proc = subprocess.run(
        ["podman", *args],
        env=podman_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    if check and proc.returncode != 0:
        pytest.fail(
            f"podman {' '.join(args[:3])} failed ({proc.returncode}): {proc.stderr[-2000:]}"
        )
    return proc

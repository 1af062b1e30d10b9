"""Fixtures for the launcher shims: real processes, real sshd, real initializer output.

* ``shim`` runs ``kf-torchrun`` / ``kf-mpirun`` (the installed console scripts) with a clean
  environment: no PET_*, KF_*, OMPI_*, PRTE_* leak in from the developer's shell.
* ``complete_asset`` writes a folder the way an initializer leaves it (files + manifest).
* ``sshd_nodes`` starts sshd on 127.0.0.2 and 127.0.0.3, port 2222, with its own host key,
  authorized key and config under a temp dir: two "nodes" for mpirun to reach over SSH.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from initializers.manifest import FileRecord, Manifest, write_manifest

SCRIPTS = Path(__file__).parent / "scripts"
BIN = Path(sys.executable).parent
SSH_PORT = 2222
NODE_ADDRESSES = ("127.0.0.2", "127.0.0.3")
_LEAKY = ("PET_", "KF_", "OMPI_", "PRTE_", "PMIX_", "MPI4PY_", "CUDA_VISIBLE_DEVICES")


def clean_env(**extra: str) -> dict[str, str]:
    """The developer's environment without anything that configures the shims or MPI."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_LEAKY)}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"  # this venv's torchrun/mpirun first
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


def console_script(name: str) -> str:
    found = BIN / name if (BIN / name).exists() else shutil.which(name)
    if not found:
        pytest.fail(f"{name} is not installed; run `pip install -e .` in the repo first")
    return str(found)


@dataclass
class Ran:
    code: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def error_lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if ": error: " in line]


@pytest.fixture
def shim():
    """``shim("kf-torchrun", *args, env={...})`` → Ran, the shim's exit code and output."""

    def run(name: str, *args: str, env: dict[str, str] | None = None, timeout: float = 120) -> Ran:
        started = time.monotonic()
        proc = subprocess.run(
            [console_script(name), *args],
            env=clean_env(**(env or {})),
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
        return Ran(proc.returncode, proc.stdout, proc.stderr, time.monotonic() - started)

    return run


def write_complete_asset(dest: Path, files: dict[str, bytes], source: str = "s3://b/m") -> Path:
    """Lay out ``dest`` as a finished initializer leaves it: the files, then the manifest."""
    records = {}
    for name, body in files.items():
        path = dest / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(body)
        records[name] = FileRecord(
            size=len(body),
            checksum="sha256:" + hashlib.sha256(body).hexdigest(),
            version=None,
            mtime_ns=path.stat().st_mtime_ns,
        )
    write_manifest(dest, Manifest(source=source, revision=None, files=records))
    return dest


@pytest.fixture
def complete_asset():
    return write_complete_asset


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass(frozen=True)
class SshNodes:
    addresses: tuple[str, ...]
    port: int
    key: Path  # the client's private key (the Secret's id_rsa)
    root: Path

    def hostfile(self, path: Path, lines: list[str]) -> Path:
        path.write_text("".join(f"{line}\n" for line in lines))
        return path


def _ssh_keygen(path: Path) -> None:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)],
        check=True,
        stdin=subprocess.DEVNULL,
    )


def start_sshd(root: Path, addresses: tuple[str, ...], port: int = SSH_PORT) -> subprocess.Popen:
    """sshd in the foreground listening on ``addresses``; keys and config under ``root``."""
    sshd = shutil.which("sshd") or "/usr/sbin/sshd"
    if not Path(sshd).exists():
        pytest.fail("sshd is missing: apt-get install openssh-server (.ci/launchers.sh does)")
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(exist_ok=True)  # privilege separation directory
    listen = "".join(f"ListenAddress {a}\n" for a in addresses)
    config = root / f"sshd_config.{'_'.join(addresses)}"
    config.write_text(
        f"Port {port}\n{listen}"
        f"HostKey {root / 'host_key'}\n"
        f"AuthorizedKeysFile {root / 'authorized_keys'}\n"
        f"PidFile {root / ('sshd.' + '_'.join(addresses) + '.pid')}\n"
        "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
    )
    proc = subprocess.Popen(
        [sshd, "-D", "-e", "-f", str(config)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=open(root / f"sshd.{'_'.join(addresses)}.log", "w"),  # noqa: SIM115
    )
    deadline = time.monotonic() + 10
    pending = set(addresses)
    while pending and time.monotonic() < deadline:
        for address in list(pending):
            try:
                with socket.create_connection((address, port), timeout=1) as sock:
                    if sock.recv(4) == b"SSH-":
                        pending.discard(address)
            except OSError:
                pass
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    if pending:
        proc.kill()
        log = (root / f"sshd.{'_'.join(addresses)}.log").read_text()[-500:]
        pytest.fail(f"sshd did not come up on {sorted(pending)}:{port} (is it taken?): {log}")
    return proc


@pytest.fixture(scope="session")
def ssh_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ssh")
    _ssh_keygen(root / "host_key")
    _ssh_keygen(root / "id_rsa")  # Kubeflow names the Secret's key id_rsa whatever its type
    shutil.copy(root / "id_rsa.pub", root / "authorized_keys")
    return root


@pytest.fixture(scope="session")
def sshd_nodes(ssh_root: Path) -> Iterator[SshNodes]:
    """sshd on 127.0.0.2 and 127.0.0.3 port 2222 for the whole session."""
    proc = start_sshd(ssh_root, NODE_ADDRESSES)
    yield SshNodes(NODE_ADDRESSES, SSH_PORT, ssh_root / "id_rsa", ssh_root)
    proc.terminate()
    proc.wait(timeout=10)

"""Fixtures for the image tests: build the images once, run containers, a bridge-network S3.

* ``images`` — builds the local base and both initializer images once per session with
  ``images/build.sh`` (podman, ``CONTAINERS_CONF`` = ``images/podman/containers.conf``) and
  returns ``{"dataset": name, "model": name}``. Layers come from podman's cache when nothing
  changed, so after ``make images`` this takes seconds.
* ``podman_run`` — ``podman_run(image, *args, env=..., network=..., ...)`` runs one container to
  completion and returns its exit code and output; ``start_container`` starts one detached.
* ``workspace`` — an empty host folder for ``/workspace``, owned by the image's user, as a
  provisioned volume would be; ``open_tmp`` — a folder under /tmp that every UID can traverse.
* ``bridge_network`` — a podman bridge network (name and gateway address), once per session.
* ``bridge_s3`` — a moto S3 server reachable from a podman bridge network (through the network's
  gateway address), as the Kubeflow SDK's local backend puts initializers on a per-job network.
  The gateway is a host address, so containers on any other bridge network (the SDK's own
  per-job ones) reach it too.
* ``bridge_hub`` — the local Hub (tests/servers/hub.py) on that gateway address, once per module.
* ``bridge_registry`` — a real OCI registry (tests/servers/registry.py) on that gateway address.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import boto3
import pytest
from moto.server import ThreadedMotoServer

from tests.conftest import ACCESS_KEY, SECRET_KEY
from tests.podman import podman, podman_env
from tests.servers.hub import HubServer
from tests.servers.registry import Registry

ROOT = Path(__file__).resolve().parents[2]
IMAGE_UID = 65532  # the images' fixed non-root user (images/initializer/Dockerfile)
BUILD_TIMEOUT = 900  # a cold build (debootstrap + pip) takes ~2.5 min; a warm one seconds
_names = itertools.count()


@dataclass
class Run:
    code: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def container_args(
    image: str,
    *args: str,
    name: str,
    env: dict[str, str] | None = None,
    network: str = "host",
    volumes: dict[Path, str] | None = None,
    options: tuple[str, ...] = (),
) -> list[str]:
    """``podman run`` arguments: no env leaks in from the host, only what the test gives."""
    cmd = ["run", "--name", name, f"--network={network}"]
    for key, value in (env or {}).items():
        cmd += ["-e", f"{key}={value}"]
    for host, target in (volumes or {}).items():
        cmd += ["-v", f"{host}:{target}"]
    return [*cmd, *options, image, *args]


def unique_name(prefix: str) -> str:
    return f"kf-e2e-{prefix}-{os.getpid()}-{next(_names)}"


@pytest.fixture(scope="session")
def images() -> dict[str, str]:
    if shutil.which("podman") is None:
        pytest.fail("podman is not installed: run `bash .ci/images.sh` (Debian packages)")
    proc = subprocess.run(
        ["bash", str(ROOT / "images" / "build.sh")],
        env=podman_env(),
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT,
        stdin=subprocess.DEVNULL,
    )
    if proc.returncode != 0:
        pytest.fail(f"images/build.sh failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    built = proc.stdout.split()
    images = {}
    for kind in ("dataset", "model"):
        named = [n for n in built if f"/{kind}-initializer:" in n]
        images[kind] = next(n for n in named if not n.endswith("-nonroot"))
        images[f"{kind}-nonroot"] = next(n for n in named if n.endswith("-nonroot"))
    return images


@pytest.fixture
def podman_run():
    """``podman_run(image, *args, env=..., network="host", volumes=..., options=...)`` → Run."""
    names: list[str] = []

    def run(image: str, *args: str, timeout: float = 180, **kwargs: object) -> Run:
        name = unique_name("run")
        names.append(name)
        proc = podman(
            *container_args(image, *args, name=name, **kwargs), timeout=timeout, check=False
        )  # type: ignore[arg-type]
        return Run(proc.returncode, proc.stdout, proc.stderr)

    yield run
    for name in names:
        podman("rm", "--force", "--time", "0", name, check=False)


@pytest.fixture
def start_container():
    """``start_container(image, *args, **kwargs)`` → name of a detached, running container."""
    names: list[str] = []

    def start(image: str, *args: str, options: tuple[str, ...] = (), **kwargs: object) -> str:
        name = unique_name("bg")
        names.append(name)
        detached = ("--detach", *options)
        podman(*container_args(image, *args, name=name, options=detached, **kwargs))  # type: ignore[arg-type]
        return name

    yield start
    for name in names:
        podman("rm", "--force", "--time", "0", name, check=False)


def wait_container(name: str, timeout: float = 180) -> Run:
    """Wait for a detached container to exit; its exit code and logs."""
    code = int(podman("wait", name, timeout=timeout).stdout.strip())
    logs = podman("logs", name)
    return Run(code, logs.stdout, logs.stderr)


def owned_dir(path: Path, uid: int = IMAGE_UID, gid: int = 0, mode: int = 0o755) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, uid, gid)
    path.chmod(mode)
    return path


def owners(root: Path) -> set[tuple[int, int]]:
    """UID:GID of ``root`` and of every entry under it, symlinks themselves included."""
    return {(p.lstat().st_uid, p.lstat().st_gid) for p in [root, *root.rglob("*")]}


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    return owned_dir(tmp_path / "workspace")


@pytest.fixture
def open_tmp() -> Iterator[Path]:
    """A fresh folder every UID can traverse (pytest's tmp_path is inside a 0700 folder), for
    what a host user other than root must reach."""
    path = Path(tempfile.mkdtemp(prefix="kf-e2e-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def termination_log(tmp_path: Path) -> Path:
    """A host file to mount at /dev/termination-log, writable by any UID (as the kubelet's)."""
    path = tmp_path / "termination-log"
    path.touch()
    path.chmod(0o666)
    return path


@dataclass
class BridgeNetwork:
    name: str
    gateway: str  # a host address: containers on every bridge network reach it


@dataclass
class BridgeS3:
    network: str
    gateway: str
    endpoint: str  # as seen from inside the bridge network
    client: object

    def bucket(self, name: str, objects: dict[str, bytes]) -> str:
        self.client.create_bucket(Bucket=name)  # type: ignore[attr-defined]
        for key, body in objects.items():
            self.client.put_object(Bucket=name, Key=key, Body=body)  # type: ignore[attr-defined]
        return name


@pytest.fixture(scope="session")
def bridge_network(images: dict[str, str]) -> Iterator[BridgeNetwork]:
    """A per-session bridge network whose gateway address exists on the host.

    The bridge interface appears when the first container joins, so a throwaway container
    starts first; then servers can bind to the gateway (not to every interface).
    """
    network = unique_name("net")
    podman("network", "create", network)
    try:
        podman("run", "--rm", f"--network={network}", "--entrypoint", "true", images["dataset"])
        info = json.loads(podman("network", "inspect", network).stdout)[0]
        yield BridgeNetwork(network, info["subnets"][0]["gateway"])
    finally:
        podman("network", "rm", "--force", network, check=False)


@pytest.fixture(scope="session")
def bridge_s3(bridge_network: BridgeNetwork) -> Iterator[BridgeS3]:
    """A moto server bound to the bridge network's gateway address."""
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = _start_moto(bridge_network.gateway)
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        client = boto3.client(
            "s3",
            endpoint_url=endpoint,
            region_name="us-east-1",
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
        )
        yield BridgeS3(bridge_network.name, bridge_network.gateway, endpoint, client)
    finally:
        server.stop()


@pytest.fixture(scope="module")
def bridge_hub(bridge_network: BridgeNetwork) -> Iterator[HubServer]:
    """The local Hub bound to the bridge network's gateway address (one per module)."""
    _wait_bindable(bridge_network.gateway)
    with HubServer(host=bridge_network.gateway) as server:
        yield server
    assert not server.leaked_auth, "a token was sent to the CDN host"
    assert not server.errors, server.errors


@pytest.fixture(scope="module")
def bridge_registry(
    bridge_network: BridgeNetwork, registry: Registry, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Registry]:
    """A registry bound to the bridge network's gateway address (after ``registry``: its
    tools, checked the same way)."""
    _wait_bindable(bridge_network.gateway)
    root = tmp_path_factory.mktemp("bridge-registry")
    with Registry(root, bind=bridge_network.gateway) as server:
        yield server


def _wait_bindable(address: str) -> None:
    deadline = time.monotonic() + 10
    while True:
        try:
            with socket.create_server((address, 0)):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _start_moto(address: str) -> ThreadedMotoServer:
    """moto on ``address``, once that address can be bound (moto's start() would hang if not)."""
    _wait_bindable(address)
    server = ThreadedMotoServer(ip_address=address, port=0, verbose=False)
    server.start()
    return server

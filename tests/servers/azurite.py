"""Azurite (Microsoft's Azure Storage emulator, npm ``azurite``) serving Blob on 127.0.0.1.

``make install`` installs it into ``.azurite/`` when node and npm are present; ``AZURITE_BLOB``
names another ``azurite-blob`` executable. ``https=True`` serves TLS with a fresh self-signed
certificate (``ca_file``) and turns on Azurite's OAuth check, which bearer tokens need.
"""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import quote

from initializers.sources.azauth import API_VERSION, SharedKey
from initializers.sources.azure import DEV_ACCOUNT, DEV_KEY
from tests.servers.ports import free_port, wait_for_port
from tests.servers.tls import self_signed

REPO = Path(__file__).resolve().parents[2]


def executable() -> Path | None:
    given = os.environ.get("AZURITE_BLOB")
    candidate = (
        Path(given) if given else REPO / ".azurite" / "node_modules" / ".bin" / "azurite-blob"
    )
    return candidate if candidate.exists() else None


class Azurite:
    def __init__(self, root: Path, https: bool = False) -> None:
        self.root = root
        self.https = https
        self.port = free_port()
        scheme = "https" if https else "http"
        self.endpoint = f"{scheme}://127.0.0.1:{self.port}/{DEV_ACCOUNT}"
        self.ca_file = root / "cert.pem"
        self._signer = SharedKey(DEV_ACCOUNT, DEV_KEY)
        self._proc: subprocess.Popen[bytes] | None = None

    def connection_string(self, key: bool = True, endpoint: str | None = None) -> str:
        parts = [f"AccountName={DEV_ACCOUNT}", f"BlobEndpoint={endpoint or self.endpoint}"]
        if key:
            parts.append(f"AccountKey={DEV_KEY}")
        return ";".join(parts) + ";"

    def start(self) -> Azurite:
        binary = executable()
        if binary is None:
            raise RuntimeError("azurite-blob not found")
        self.root.mkdir(parents=True, exist_ok=True)
        argv = [
            str(binary),
            *("--blobHost", "127.0.0.1", "--blobPort", str(self.port)),
            "--skipApiVersionCheck",
            "--loose",
            "--disableTelemetry",
            "--inMemoryPersistence",
            "--silent",
        ]
        if self.https:
            key_file = self._self_signed()
            argv += ["--cert", str(self.ca_file), "--key", str(key_file), "--oauth", "basic"]
        self._proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for_port(self.port, 30, "Azurite")
        return self

    def _self_signed(self) -> Path:
        key_file = self.root / "key.pem"
        self_signed(self.ca_file, key_file)
        return key_file

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()

    # -- a small client (Shared Key), for filling containers -------------------------------------

    def call(self, method: str, path: str, body: bytes = b"", **headers: str) -> tuple[int, bytes]:
        url = self.endpoint + path
        sent = {"x-ms-version": API_VERSION, "Content-Length": str(len(body)), **headers}
        if body or method == "PUT":
            sent.setdefault("Content-Type", "application/octet-stream")
        signed = self._signer.headers(method, url, sent)
        request = urllib.request.Request(
            url, data=body if method == "PUT" else None, method=method, headers=signed
        )
        context = None
        if self.https:
            import ssl

            context = ssl.create_default_context(cafile=str(self.ca_file))
        try:
            with urllib.request.urlopen(request, timeout=30, context=context) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def create_container(self, name: str, public: bool = False) -> None:
        """Create it (or find it there already)."""
        extra = {"x-ms-blob-public-access": "container"} if public else {}
        status, body = self.call("PUT", f"/{name}?restype=container", **extra)
        assert status in (201, 409), body

    def put(self, container: str, name: str, body: bytes, md5: bool = True) -> None:
        """A block blob; ``md5=False`` builds it from a block list, which stores no Content-MD5."""
        path = f"/{container}/{quote(name, safe='/')}"
        if md5:
            status, answer = self.call("PUT", path, body, **{"x-ms-blob-type": "BlockBlob"})
            assert status == 201, answer
            return
        block = base64.b64encode(b"block-0").decode()
        status, answer = self.call("PUT", f"{path}?comp=block&blockid={quote(block)}", body)
        assert status == 201, answer
        blocks = (
            f'<?xml version="1.0" encoding="utf-8"?><BlockList><Latest>{block}</Latest></BlockList>'
        )
        status, answer = self.call(
            "PUT", f"{path}?comp=blocklist", blocks.encode(), **{"Content-Type": "application/xml"}
        )
        assert status == 201, answer

    def set_md5(self, container: str, name: str, body: bytes) -> None:
        """Record ``body``'s MD5 as the blob's Content-MD5, whatever the blob holds."""
        md5 = base64.b64encode(hashlib.md5(body).digest()).decode()
        path = f"/{container}/{quote(name, safe='/')}?comp=properties"
        status, answer = self.call("PUT", path, **{"x-ms-blob-content-md5": md5})
        assert status == 200, answer

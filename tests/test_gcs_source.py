"""gs:// against fake-gcs-server: layout, verification, credentials, faults, kills."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import quote
from urllib.request import urlopen

import pytest
from awscrt.checksums import crc32c
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from initializers.config import AssetDefaults, load_settings
from initializers.manifest import find_problems, read_manifest
from initializers.sources import open_source
from tests.conftest import clean_env, tree
from tests.reliability.conftest import dataset
from tests.servers.faultproxy import FaultProxy
from tests.servers.tokens import TokenServer

MIB = 1 << 20
FILES = dataset(
    41,
    {
        "config.json": 200,
        "model.safetensors": 40 * MIB,
        "tokenizer/tokenizer.json": 300_000,
    },
)


def fill(emulator, bucket: str, prefix: str, files: dict[str, bytes]) -> None:
    for name, body in files.items():
        emulator.put(bucket, f"{prefix}/{name}", body)


def gcs_env(emulator, uri: str, out: Path, **extra: str) -> dict[str, str]:
    return {
        "STORAGE_URI": uri,
        "OUTPUT_PATH": str(out),
        "STORAGE_EMULATOR_HOST": emulator.url,
        **extra,
    }


def test_a_prefix_is_fetched_relative_to_it_verified_by_crc32c_and_md5_and_a_rerun_fetches_nothing(
    gcs_emulator, gcs_bucket, run_initializer, tmp_path
):
    fill(gcs_emulator, gcs_bucket, "models/llama", FILES)
    gcs_emulator.put(gcs_bucket, "models/llama-v2/config.json", b"{}")  # not under models/llama/
    out = tmp_path / "model"
    env = gcs_env(gcs_emulator, f"gs://{gcs_bucket}/models/llama", out)
    first = run_initializer("model", env=env)
    assert first.code == 0, first.output
    assert tree(out) == FILES
    assert find_problems(out) == []
    checksums = {r.checksum.split(":")[0] for r in read_manifest(out).files.values()}
    assert checksums == {"crc32c+md5-base64"}

    again = run_initializer("model", env=env)
    assert again.code == 0, again.output
    assert "already complete" in again.stderr


def test_one_object_lands_under_its_own_name(gcs_emulator, gcs_bucket, run_initializer, tmp_path):
    fill(gcs_emulator, gcs_bucket, "m", {"config.json": b'{"a": 1}'})
    out = tmp_path / "model"
    result = run_initializer(
        "model",
        "--storage-uri",
        f"gs://{gcs_bucket}/m/config.json",
        "--output",
        str(out),
        env={"STORAGE_EMULATOR_HOST": gcs_emulator.url},
    )
    assert result.code == 0, result.output
    assert tree(out) == {"config.json": b'{"a": 1}'}


def same_crc32c_other_bytes(body: bytes) -> bytes:
    """``body`` damaged at its first byte, its last 4 bytes then set so the crc32c stays the
    same: damage crc32c cannot see. A CRC is affine in the bytes, so the 4 bytes are the
    solution of 32 linear equations over GF(2); no such shortcut exists for MD5."""
    damaged = bytearray(body)
    damaged[0] ^= 0xFF
    tail = int.from_bytes(damaged[-4:], "big")

    def crc_with(flip: int) -> int:
        damaged[-4:] = (tail ^ flip).to_bytes(4, "big")
        return crc32c(bytes(damaged))

    unflipped = crc_with(0)
    basis: list[tuple[int, int]] = []  # (crc change, bits flipped), distinct top bits, descending
    for bit in range(32):
        change, flips = crc_with(1 << bit) ^ unflipped, 1 << bit
        for known, known_flips in basis:
            if change ^ known < change:  # known's top bit is set in change
                change, flips = change ^ known, flips ^ known_flips
        if change:
            basis = sorted([*basis, (change, flips)], reverse=True)
    wanted, flips = unflipped ^ crc32c(body), 0
    for known, known_flips in basis:
        if wanted ^ known < wanted:
            wanted, flips = wanted ^ known, flips ^ known_flips
    assert wanted == 0
    crc_with(flips)
    return bytes(damaged)


def relist_md5(emulator, bucket: str, name: str, md5: str) -> None:
    """Make the emulator list ``md5`` as the object's md5Hash (fake-gcs-server's filesystem
    backend keeps an object's metadata, checksums included, in its ``user.metadata`` xattr)."""
    stored = emulator.object_file(bucket, name)
    meta = json.loads(os.getxattr(stored, "user.metadata"))
    os.setxattr(stored, "user.metadata", json.dumps({**meta, "Md5Hash": md5}).encode())
    with urlopen(f"{emulator.url}/storage/v1/b/{bucket}/o/{quote(name, safe='')}") as listed:
        assert json.load(listed)["md5Hash"] == md5


def md5_base64(body: bytes) -> str:
    return base64.b64encode(hashlib.md5(body).digest()).decode()


def test_an_object_damaged_behind_its_checksum_fails_with_exit_5(
    gcs_emulator, gcs_bucket, run_initializer, tmp_path
):
    fill(gcs_emulator, gcs_bucket, "d", {"a.bin": b"a" * 100_000})
    stored = gcs_emulator.object_file(gcs_bucket, "d/a.bin")
    stored.write_bytes(b"b" * 100_000)  # same size, the listed crc32c no longer matches
    out = tmp_path / "out"
    result = run_initializer("dataset", env=gcs_env(gcs_emulator, f"gs://{gcs_bucket}/d", out))
    assert result.code == 5, result.output
    assert "checksum" in result.stderr
    assert tree(out) == {}


@pytest.mark.parametrize(
    "caught_by",
    ["md5Hash", "crc32c"],
    ids=["bytes-changed-behind-an-unchanged-crc32c", "bytes-changed-and-md5Hash-changed-too"],
)
def test_an_object_tampered_behind_either_of_its_checksums_fails_with_exit_5(
    caught_by, gcs_emulator, gcs_bucket, run_initializer, tmp_path
):
    body = os.urandom(100_000)
    fill(gcs_emulator, gcs_bucket, "d", {"a.bin": body})
    stored = gcs_emulator.object_file(gcs_bucket, "d/a.bin")
    if caught_by == "md5Hash":
        stored.write_bytes(same_crc32c_other_bytes(body))  # only MD5 can tell
        assert stored.read_bytes() != body and crc32c(stored.read_bytes()) == crc32c(body)
    else:
        stored.write_bytes(os.urandom(100_000))
        relist_md5(gcs_emulator, gcs_bucket, "d/a.bin", md5_base64(stored.read_bytes()))
    out = tmp_path / "out"
    result = run_initializer("dataset", env=gcs_env(gcs_emulator, f"gs://{gcs_bucket}/d", out))
    assert result.code == 5, result.output
    assert "checksum mismatch" in result.stderr
    assert tree(out) == {}


@pytest.mark.parametrize(
    ("uri", "code", "words"),
    [
        ("gs://no-such-bucket-4242/d", 4, "not found"),
        ("gs://{bucket}/nothing-here", 4, "no objects under"),
        ("gs://{bucket}", 2, "names a whole bucket"),
        ("gs://Bad_Bucket/d", 2, "is not a valid bucket name"),
    ],
)
def test_missing_or_malformed_gcs_locations_exit_with_a_clear_error(
    uri, code, words, gcs_emulator, gcs_bucket, run_initializer, tmp_path
):
    env = gcs_env(gcs_emulator, uri.format(bucket=gcs_bucket), tmp_path / "out")
    result = run_initializer("dataset", env=env)
    assert result.code == code, result.output
    assert words in result.stderr
    assert "Traceback" not in result.output


# -- credentials ------------------------------------------------------------------------------


def service_account_key(token_uri: str) -> tuple[str, str]:
    """A fresh key's JSON, and its private key (which must never be printed)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    info = {
        "type": "service_account",
        "project_id": "test",
        "private_key_id": "k1",
        "private_key": pem,
        "client_email": "initializer@test.iam.gserviceaccount.com",
        "client_id": "1",
        "token_uri": token_uri,
    }
    return json.dumps(info), pem


@pytest.fixture
def token_server() -> Iterator[Callable[[bool], TokenServer]]:
    started: list[TokenServer] = []

    def start(grant: bool) -> TokenServer:
        started.append(TokenServer(lambda form: "ya29.test-token" if grant else None))
        return started[-1]

    yield start
    for server in started:
        server.stop()


@pytest.mark.parametrize("as_file", [False, True], ids=["key-json-in-env", "key-file"])
def test_a_service_account_key_gets_a_token_before_the_listing(
    as_file, gcs_emulator, gcs_bucket, token_server, run_initializer, tmp_path
):
    fill(gcs_emulator, gcs_bucket, "d", {"a.txt": b"a"})
    tokens = token_server(grant=True)
    key, _ = service_account_key(tokens.url + "/token")
    if as_file:
        (tmp_path / "key.json").write_text(key)
        extra = {"GOOGLE_APPLICATION_CREDENTIALS": str(tmp_path / "key.json")}
    else:
        extra = {"GOOGLE_APPLICATION_CREDENTIALS_JSON": key}
    out = tmp_path / "out"
    result = run_initializer(
        "dataset", env=gcs_env(gcs_emulator, f"gs://{gcs_bucket}/d", out, DEBUG="1", **extra)
    )
    assert result.code == 0, result.output
    assert tree(out) == {"a.txt": b"a"}
    assert len(tokens.forms) == 1  # one token, reused for every request
    assert tokens.forms[0]["grant_type"] == "urn:ietf:params:oauth:grant-type:jwt-bearer"
    assert "PRIVATE KEY" not in result.output and "ya29.test-token" not in result.output


def test_a_key_the_token_endpoint_refuses_exits_3_without_printing_the_key(
    gcs_emulator, gcs_bucket, token_server, run_initializer, tmp_path
):
    fill(gcs_emulator, gcs_bucket, "d", {"a.txt": b"a"})
    key, pem = service_account_key(token_server(grant=False).url + "/token")
    env = gcs_env(
        gcs_emulator,
        f"gs://{gcs_bucket}/d",
        tmp_path / "out",
        GOOGLE_APPLICATION_CREDENTIALS_JSON=key,
    )
    result = run_initializer("dataset", env=env)
    assert result.code == 3, result.output
    assert "cannot get a GCS access token" in result.stderr
    assert "PRIVATE KEY" not in result.output and pem[40:80] not in result.output


def test_no_credentials_at_all_exit_3_naming_every_way_to_give_them(run_initializer, tmp_path):
    env = {
        "STORAGE_URI": "gs://some-bucket/d",
        "OUTPUT_PATH": str(tmp_path / "out"),
        "NO_GCE_CHECK": "true",  # off GCE: do not wait for a metadata server
        "CLOUDSDK_CONFIG": str(tmp_path / "gcloud"),
    }
    result = run_initializer("dataset", env=env)
    assert result.code == 3, result.output
    assert "no GCS credentials found" in result.stderr
    assert "GOOGLE_APPLICATION_CREDENTIALS_JSON" in result.stderr and "--anonymous" in result.stderr


def test_a_key_that_is_not_json_exits_2(run_initializer, tmp_path):
    env = {
        "STORAGE_URI": "gs://some-bucket/d",
        "OUTPUT_PATH": str(tmp_path / "out"),
        "GOOGLE_APPLICATION_CREDENTIALS_JSON": "not-json-secret-1234",
    }
    result = run_initializer("dataset", env=env)
    assert result.code == 2, result.output
    assert "is not valid JSON" in result.stderr
    assert "not-json-secret-1234" not in result.output


class _GkeMetadata(BaseHTTPRequestHandler):
    """The GKE metadata server as google-auth sees it, on 127.0.0.1: the ping, the project, the
    pod's service account and its token (Workload Identity). Every request must carry
    ``Metadata-Flavor: Google``; the paths asked are recorded."""

    def do_GET(self) -> None:
        self.server.asked.append((self.path, self.headers.get("Metadata-Flavor")))  # type: ignore[attr-defined]
        path = self.path.partition("?")[0]
        account = "/computeMetadata/v1/instance/service-accounts/default/"
        if path.endswith("/token"):
            body = json.dumps({"access_token": "ya29.gke-metadata", "expires_in": 3600,
                               "token_type": "Bearer"})  # fmt: skip
        elif path == account:
            scopes = ["https://www.googleapis.com/auth/cloud-platform"]
            email = "trainer@p.iam.gserviceaccount.com"
            body = json.dumps({"email": email, "aliases": ["default"], "scopes": scopes})
        elif path.endswith("/project/project-id"):
            body = "test-project"
        else:
            body = ""
        data = body.encode()
        self.send_response(200)
        self.send_header("Metadata-Flavor", "Google")
        self.send_header("Content-Type", "application/json" if body[:1] == "{" else "text/plain")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


GET_TOKEN = """
import json, sys
from initializers.config import load_settings
from initializers.dataset import DEFAULTS
from initializers.sources import open_source
source = open_source(load_settings(DEFAULTS, ["--storage-uri", "gs://bucket/data"], {}))
print(json.dumps(source._auth()))
"""


def test_on_gke_the_metadata_servers_token_is_used_without_any_key(tmp_path):
    """Workload Identity: no key anywhere, google-auth finds the metadata server (a stand-in on
    127.0.0.1 through ``GCE_METADATA_HOST`` / ``GCE_METADATA_IP``, never 169.254.169.254) and
    the source's requests carry the token it gave for the pod's service account."""
    metadata = ThreadingHTTPServer(("127.0.0.1", 0), _GkeMetadata)
    metadata.asked = []  # type: ignore[attr-defined]
    threading.Thread(target=metadata.serve_forever, daemon=True).start()
    where = f"127.0.0.1:{metadata.server_address[1]}"
    env = clean_env(tmp_path, GCE_METADATA_HOST=where, GCE_METADATA_IP=where,
                    CLOUDSDK_CONFIG=str(tmp_path / "no-gcloud"))  # fmt: skip
    try:
        ran = subprocess.run([sys.executable, "-c", GET_TOKEN], env=env, capture_output=True,
                             text=True, timeout=60)  # fmt: skip
    finally:
        metadata.shutdown()
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout) == {"Authorization": "Bearer ya29.gke-metadata"}
    asked = metadata.asked  # type: ignore[attr-defined]
    assert any(path.partition("?")[0].endswith("/token") for path, _ in asked), asked
    assert {flavor for _, flavor in asked} == {"Google"}


def test_a_rerun_over_more_than_a_page_is_checked_in_key_ranges_and_fetches_only_a_changed_object(
    gcs_emulator, gcs_bucket, run_initializer, tmp_path
):
    """The warm rerun's parallel check (``startOffset``, which lists from a key itself)."""
    names = [f"{i // 100:02d}/{i:04d}.txt" for i in range(1010)]  # past the first page of 1,000
    fill(gcs_emulator, gcs_bucket, "d", {name: name.encode() for name in names})
    out = tmp_path / "out"
    env = gcs_env(gcs_emulator, f"gs://{gcs_bucket}/d", out)
    assert run_initializer("dataset", env=env).code == 0

    again = run_initializer("dataset", env=env)
    assert again.code == 0, again.stderr
    assert "checking the complete tree against the source" in again.stderr
    assert "already complete (1010 files" in again.stderr and "changed since" not in again.stderr

    gcs_emulator.put(gcs_bucket, f"d/{names[700]}", b"a new generation")
    changed = run_initializer("dataset", env=env)
    assert changed.code == 0, changed.stderr
    assert "changed since the last complete run" in changed.stderr
    assert "done — 1 fetched, 1009 already present" in changed.stderr
    assert (out / names[700]).read_bytes() == b"a new generation"
    assert find_problems(out) == []


def test_a_listing_of_more_than_a_page_returns_after_its_first_without_asking_for_the_second(
    gcs_emulator, gcs_bucket, tmp_path
):
    names = [f"{i:04d}.txt" for i in range(1001)]  # a page of 1,000 and one more
    fill(gcs_emulator, gcs_bucket, "d", {name: b"x" for name in names})
    proxy = FaultProxy(gcs_emulator.url).start()
    try:
        settings = load_settings(
            AssetDefaults("dataset", tmp_path),
            ["--storage-uri", f"gs://{gcs_bucket}/d"],
            env={"STORAGE_EMULATOR_HOST": proxy.url},
        )
        listing = open_source(settings).list()
        listings = [r for r in proxy.received if r.path.endswith(f"/b/{gcs_bucket}/o")]
        assert len(listings) == 1 and len(listing.files) == 1000
        listing.complete()
        listings = [r for r in proxy.received if r.path.endswith(f"/b/{gcs_bucket}/o")]
    finally:
        proxy.stop()
    assert len(listings) == 2 and sorted(f.path for f in listing.files) == names

"""The test registry (tests/servers/registry.py): what oras and skopeo pushed, read back raw.

Expected digests and tar members are computed here from the bytes given, not asked of the
fixture.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import ssl
import tarfile
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.servers.registry import (
    OCI_INDEX,
    OCI_MANIFEST,
    TITLE,
    Registry,
    missing_tools,
    tar_bytes,
    write_layout,
)

pytestmark = pytest.mark.skipif(
    bool(missing_tools()), reason=f"the test registry needs {', '.join(missing_tools())}"
)
WEIGHTS = bytes(range(256)) * 40


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def members(layer: bytes) -> dict[str, bytes | None]:
    """A tar's members in order: name → bytes of a file, None for anything else."""
    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        return {
            m.name: tar.extractfile(m).read() if m.isfile() else None  # type: ignore[union-attr]
            for m in tar.getmembers()
        }


def fetch(url: str, headers: dict[str, str], context: ssl.SSLContext | None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@pytest.fixture
def files(tmp_path: Path) -> Path:
    folder = tmp_path / "files"
    (folder / "weights").mkdir(parents=True)
    (folder / "data").mkdir()
    (folder / "config.json").write_bytes(b'{"model_type": "tiny"}')
    (folder / "weights" / "model.bin").write_bytes(WEIGHTS)
    (folder / "data" / "a.txt").write_bytes(b"a\n")
    return folder


def test_push_files_titles_each_layer_and_blobs_answer_ranges(tmp_path: Path, files: Path) -> None:
    names = ["config.json", "weights/model.bin", "data"]
    with Registry(tmp_path / "registry") as registry:
        pushed = registry.push_files("models/tiny:v1", files, names)
        manifest, digest = registry.manifest("models/tiny:v1", OCI_MANIFEST)
        by_digest = f"/v2/models/tiny/manifests/{pushed}"
        _, _, raw = registry.request("GET", by_digest, {"Accept": OCI_MANIFEST})
        unaccepted = registry.request("GET", by_digest, {"Accept": "*/*"})
        ranged = registry.request(
            "GET", f"/v2/models/tiny/blobs/{sha256(WEIGHTS)}", {"Range": "bytes=0-9"}
        )
        folder_layer = manifest["layers"][2]["digest"]
        _, _, tar_gz = registry.request("GET", f"/v2/models/tiny/blobs/{folder_layer}")

    assert digest == pushed == sha256(raw)
    assert unaccepted[0] == 404  # Distribution 2.8 serves OCI manifests only to who names the type
    assert manifest["mediaType"] == OCI_MANIFEST
    assert [layer["annotations"][TITLE] for layer in manifest["layers"]] == names
    assert [layer["digest"] for layer in manifest["layers"][:2]] == [
        sha256((files / "config.json").read_bytes()),
        sha256(WEIGHTS),
    ]
    assert manifest["layers"][2]["mediaType"] == "application/vnd.oci.image.layer.v1.tar+gzip"
    assert members(gzip.decompress(tar_gz)) == {"data": None, "data/a.txt": b"a\n"}
    status, headers, body = ranged
    assert status == 206
    assert body == WEIGHTS[:10]
    assert headers["Content-Range"] == f"bytes 0-9/{len(WEIGHTS)}"


def test_basic_auth_refuses_a_wrong_password(tmp_path: Path, files: Path) -> None:
    wrong = "Basic " + base64.b64encode(b"puller:not-the-password").decode()
    with Registry(tmp_path / "registry", auth="basic") as registry:
        pushed = registry.push_files("models/tiny:v1", files, ["config.json"])
        anonymous = registry.request("GET", "/v2/", authorized=False)
        refused = registry.request("GET", "/v2/", {"Authorization": wrong}, authorized=False)
        allowed = registry.request("GET", "/v2/")
        _, digest = registry.manifest("models/tiny:v1", OCI_MANIFEST)

    assert anonymous[0] == 401
    assert anonymous[1]["Www-Authenticate"].startswith("Basic realm=")
    assert refused[0] == 401
    assert allowed[0] == 200
    assert digest == pushed


def test_token_auth_challenges_and_grants_what_the_scope_asks(tmp_path: Path, files: Path) -> None:
    with Registry(tmp_path / "registry", auth="token") as registry:
        registry.push_files("models/tiny:v1", files, ["config.json"])
        assert registry.token_requests == []  # the fixture's own pushes are not listed
        ping = registry.request("GET", "/v2/", authorized=False)
        path = "/v2/models/tiny/manifests/v1"
        challenge = registry.request("GET", path, authorized=False)[1]["Www-Authenticate"]
        scope = "repository:models/tiny:pull"
        realm = f"{registry.realm}?service={registry.service}&scope={scope}"
        anonymous = fetch(realm, {}, None)
        basic = "Basic " + base64.b64encode(b"puller:s3cret-pw").decode()
        status, answer = fetch(realm, {"Authorization": basic}, None)
        token = json.loads(answer)["token"]
        bearer = {"Authorization": f"Bearer {token}", "Accept": OCI_MANIFEST}
        pulled = registry.request("GET", path, bearer, authorized=False)
        push = registry.request(
            "POST", "/v2/models/tiny/blobs/uploads/", bearer, body=b"", authorized=False
        )

    assert ping[0] == 401
    assert ping[1]["Www-Authenticate"] == (
        f'Bearer realm="{registry.realm}",service="registry.test"'
    )
    assert challenge.endswith(f'scope="{scope}"')
    assert anonymous[0] == 401
    assert status == 200
    assert pulled[0] == 200
    assert push[0] == 401  # a pull token does not push
    claims = json.loads(base64.urlsafe_b64decode(token.split(".")[1] + "=="))
    assert claims["access"] == [{"type": "repository", "name": "models/tiny", "actions": ["pull"]}]
    assert claims["aud"] == "registry.test"
    assert registry.token_requests == [{"service": "registry.test", "scope": scope}] * 2


def test_a_multi_platform_layout_pushed_with_all_platforms_is_an_index(tmp_path: Path) -> None:
    layer = tar_bytes({"etc": None, "etc/.wh.gone": b"", "etc/kept": b"kept\n"})
    layout = tmp_path / "layout"
    written = write_layout(layout, [layer], platforms=["linux/amd64", "linux/arm64"])
    with Registry(tmp_path / "registry") as registry:
        pushed = registry.push_layout(layout, "images/multi:v1", all_platforms=True)
        index, _ = registry.manifest("images/multi:v1", OCI_INDEX)
        children = {}
        for entry in index["manifests"]:
            manifest, _ = registry.manifest(f"images/multi@{entry['digest']}", OCI_MANIFEST)
            marker = manifest["layers"][-1]["digest"]
            _, _, config = registry.request(
                "GET", f"/v2/images/multi/blobs/{manifest['config']['digest']}"
            )
            _, _, tar = registry.request("GET", f"/v2/images/multi/blobs/{marker}")
            children[entry["platform"]["architecture"]] = (manifest, json.loads(config), tar)
        one = registry.push_layout(layout, "images/one:v1")

    assert pushed == written  # skopeo kept the digests
    assert index["mediaType"] == OCI_INDEX
    assert [(m["platform"]["os"], m["platform"]["architecture"]) for m in index["manifests"]] == [
        ("linux", "amd64"),
        ("linux", "arm64"),
    ]
    assert one in {m["digest"] for m in index["manifests"]}
    for arch, (manifest, config, tar) in children.items():
        assert manifest["layers"][0]["digest"] == sha256(layer)
        assert members(tar) == {"models/platform.txt": f"linux/{arch}".encode()}
        assert config["architecture"] == arch
        assert config["rootfs"]["diff_ids"] == [sha256(layer), sha256(tar)]


def test_tls_with_ca_file_verifies(tmp_path: Path, files: Path) -> None:
    layout = tmp_path / "layout"
    write_layout(
        layout,
        [tar_bytes({"f.txt": b"f"}, gzip=True)],
        layer_media_type="application/vnd.oci.image.layer.v1.tar+gzip",
    )
    with Registry(tmp_path / "registry", auth="token", tls=True) as registry:
        assert registry.ca_file is not None
        registry.push_files("models/tiny:v1", files, ["config.json"])
        registry.push_layout(layout, "images/one:v1")
        trusting = ssl.create_default_context(cafile=str(registry.ca_file))
        verified = fetch(f"https://{registry.host}/v2/", {}, trusting)
        with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
            fetch(f"https://{registry.host}/v2/", {}, ssl.create_default_context())
        manifest, _ = registry.manifest("images/one:v1", OCI_MANIFEST)

    assert registry.realm is not None and registry.realm.startswith("https://127.0.0.1:")
    assert verified[0] == 401  # TLS verified; credentials needed
    assert manifest["layers"][0]["mediaType"] == "application/vnd.oci.image.layer.v1.tar+gzip"


def test_put_blob_bytes_makes_the_registry_serve_other_bytes(tmp_path: Path, files: Path) -> None:
    with Registry(tmp_path / "registry") as registry:
        registry.push_files("models/tiny:v1", files, ["weights/model.bin"])
        registry.put_blob_bytes("models/tiny", sha256(WEIGHTS), b"tampered")
        status, headers, body = registry.request("GET", f"/v2/models/tiny/blobs/{sha256(WEIGHTS)}")

    assert status == 200
    assert body == b"tampered"
    assert headers["Docker-Content-Digest"] == sha256(WEIGHTS)


def test_tar_bytes_keeps_hostile_names_links_and_the_order_given() -> None:
    entries: dict[str, bytes | None] = {"dir": None, "dir/.wh..wh..opq": b"", "../evil": b"x"}
    layer = tar_bytes(
        entries,
        links={"hard": "../evil"},
        symlinks={"sym": "/etc"},
        order=["sym", *entries, "hard"],
    )
    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        found = [(m.name, m.type, m.linkname) for m in tar.getmembers()]
    assert found == [
        ("sym", tarfile.SYMTYPE, "/etc"),
        ("dir", tarfile.DIRTYPE, ""),
        ("dir/.wh..wh..opq", tarfile.REGTYPE, ""),
        ("../evil", tarfile.REGTYPE, ""),
        ("hard", tarfile.LNKTYPE, "../evil"),
    ]
    assert gzip.decompress(tar_bytes(entries, gzip=True)) == tar_bytes(entries)

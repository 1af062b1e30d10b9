"""http(s):// — one file by URL, ranged when the server allows it; archives unpacked."""

from __future__ import annotations

import io
import random
import tarfile
import threading
import zipfile

import pytest

from initializers.errors import Interrupted
from initializers.manifest import find_problems, read_manifest
from initializers.unpack import unpack
from tests.conftest import tree
from tests.servers.files import file_server

MIB = 1 << 20
SECRET = "Bearer web-secret-token-5e1a"
RNG = random.Random(21)
MODEL = {
    "config.json": b'{"model_type": "llama"}',
    "model.safetensors": RNG.randbytes(3 * MIB),
    "tokenizer/tokenizer.json": RNG.randbytes(200_000),
}


def tar_bytes(files: dict[str, bytes], mode: str = "w:gz") -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode=mode) as archive:
        for name, body in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(body)
            archive.addfile(info, io.BytesIO(body))
    return buffer.getvalue()


def zip_bytes(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, body in files.items():
            archive.writestr(name, body)
    return buffer.getvalue()


def fetch(run_initializer, url: str, out, *args: str, env: dict[str, str] | None = None):
    return run_initializer("model", "--storage-uri", url, "--output", str(out), *args, env=env)


def test_a_large_file_comes_in_parallel_ranges_and_a_rerun_fetches_nothing(
    web, run_initializer, tmp_path
):
    body = RNG.randbytes(64 * MIB)
    url = web.put("/releases/model.safetensors", body)
    out = tmp_path / "model"
    first = fetch(run_initializer, url, out)
    assert first.code == 0, first.output
    assert tree(out) == {"model.safetensors": body}
    assert find_problems(out) == []
    ranges = [h.get("Range") for h in web.gets("/releases/model.safetensors")]
    assert ranges.count("bytes=0-0") == 1  # the listing
    assert len([r for r in ranges if r and r != "bytes=0-0"]) == 2  # 64 MiB: two ranges

    again = fetch(run_initializer, url, out)
    assert again.code == 0, again.output
    assert "already complete" in again.stderr
    assert web.body_bytes < 64 * MIB + 10  # nothing fetched twice


def test_without_ranges_the_cli_fetches_whole_and_verifies_the_size(run_initializer, tmp_path):
    body = RNG.randbytes(40 * MIB)
    with file_server(ranges=False) as server:
        url = server.put("/model.safetensors", body)
        result = fetch(run_initializer, url, tmp_path / "out")
        assert result.code == 0, result.output
        assert tree(tmp_path / "out") == {"model.safetensors": body}
        assert len(server.gets("/model.safetensors")) == 2  # the listing, then one whole GET


@pytest.mark.parametrize(
    ("name", "archive"),
    [
        ("model.tar.gz", tar_bytes(MODEL)),
        ("model.tgz", tar_bytes(MODEL)),
        ("model.tar", tar_bytes(MODEL, "w")),
        ("model.zip", zip_bytes(MODEL)),
    ],
)
def test_an_archive_is_unpacked_into_the_destination_and_never_left_under_a_final_name(
    name, archive, web, run_initializer, tmp_path
):
    url = web.put(f"/dl/{name}", archive)
    out = tmp_path / "model"
    result = fetch(run_initializer, url, out)
    assert result.code == 0, result.output
    assert tree(out) == MODEL
    assert find_problems(out) == []
    assert sorted(read_manifest(out).files) == sorted(MODEL)
    assert not any(p.name == name for p in out.rglob("*"))
    assert not (out / ".initializer-archive").exists()

    again = fetch(run_initializer, url, out)
    assert again.code == 0, again.output
    assert "already complete" in again.stderr
    assert len(web.gets(f"/dl/{name}")) == 3  # listing + archive, then only the rerun's listing


def test_a_changed_archive_replaces_the_tree_and_removes_what_it_no_longer_holds(
    web, run_initializer, tmp_path
):
    out = tmp_path / "model"
    url = web.put("/dl/model.tar.gz", tar_bytes(MODEL))
    assert fetch(run_initializer, url, out).code == 0
    newer = {"config.json": b'{"model_type": "mistral"}', "model.safetensors": b"new weights"}
    web.put("/dl/model.tar.gz", tar_bytes(newer))
    result = fetch(run_initializer, url, out)
    assert result.code == 0, result.output
    assert tree(out) == newer


def test_the_model_weights_preference_applies_to_the_archive_members(
    web, run_initializer, tmp_path
):
    members = {**MODEL, "pytorch_model.bin": b"pickle weights"}
    url = web.put("/dl/model.zip", zip_bytes(members))
    result = fetch(run_initializer, url, tmp_path / "model")
    assert result.code == 0, result.output
    assert tree(tmp_path / "model") == MODEL  # *.safetensors found: the .bin is left out
    allowed = fetch(run_initializer, url, tmp_path / "cfg", "--allow-patterns", "*.json")
    assert allowed.code == 0, allowed.output
    assert sorted(tree(tmp_path / "cfg")) == ["config.json", "tokenizer/tokenizer.json"]


def test_headers_from_http_headers_reach_the_server_and_never_the_logs(
    web, run_initializer, tmp_path
):
    web.required = {"Authorization": SECRET}
    url = web.put("/private/config.json", b"{}") + "?X-Signature=sig-in-the-query-9f3"
    denied = fetch(run_initializer, url, tmp_path / "a")
    assert denied.code == 3, denied.output
    env = {"HTTP_HEADERS": f'{{"Authorization": "{SECRET}"}}', "DEBUG": "1"}
    allowed = fetch(run_initializer, url, tmp_path / "b", env=env)
    assert allowed.code == 0, allowed.output
    for result in (denied, allowed):
        assert SECRET not in result.output and "web-secret" not in result.output
        assert "sig-in-the-query" not in result.output


def test_private_headers_are_not_sent_on_to_another_host_after_a_redirect(
    web, run_initializer, tmp_path
):
    with file_server() as mirror:
        target = mirror.put("/blob/config.json", b"{}").replace("127.0.0.1", "localhost")
        web.redirects["/private/config.json"] = target
        env = {"HTTP_HEADERS": '{"X-Api-Key": "key-7731"}'}
        result = fetch(run_initializer, web.url + "/private/config.json", tmp_path / "o", env=env)
        assert result.code == 0, result.output
        assert tree(tmp_path / "o") == {"config.json": b"{}"}
        assert all(h.get("X-Api-Key") == "key-7731" for h in web.gets("/private/config.json"))
        assert mirror.gets("/blob/config.json")
        assert not any("X-Api-Key" in h for h in mirror.gets("/blob/config.json"))


@pytest.mark.parametrize(
    ("uri", "code", "words"),
    [
        ("https://", 2, "scheme://location"),
        ("https://example.invalid/models/", 2, "does not end with a file name"),
    ],
)
def test_bad_urls_exit_with_a_clear_error(uri, code, words, run_initializer, tmp_path):
    result = fetch(run_initializer, uri, tmp_path / "out")
    assert result.code == code, result.output
    assert words in result.stderr
    assert "Traceback" not in result.output


def test_a_missing_file_exits_4_and_a_dead_server_exits_7(web, run_initializer, tmp_path):
    missing = fetch(run_initializer, web.url + "/nope/model.bin", tmp_path / "a")
    assert missing.code == 4, missing.output
    dead = fetch(run_initializer, "http://127.0.0.1:9/model.bin", tmp_path / "b", "--retries", "2")
    assert dead.code == 7, dead.output
    assert "cannot connect" in dead.stderr


def test_a_stop_during_unpacking_leaves_no_member_under_its_final_name(tmp_path):
    archive = tmp_path / "model.tar.gz"
    archive.write_bytes(tar_bytes(MODEL))
    out = tmp_path / "out"
    out.mkdir()
    stop = threading.Event()
    stop.set()  # SIGTERM arrived: the first chunk of the first member is not written
    with pytest.raises(Interrupted):
        unpack(archive, out, '"v1"', lambda files: files, stop)
    assert tree(out) == {}

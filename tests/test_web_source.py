"""http(s):// — one file by URL, ranged when the server allows it; archives unpacked."""

from __future__ import annotations

import hashlib
import io
import random
import tarfile
import threading
import time
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from initializers.errors import Interrupted
from initializers.manifest import find_problems, read_manifest
from initializers.unpack import unpack
from tests.conftest import tree
from tests.servers.files import file_server
from tests.servers.nginx import Nginx, Request
from tests.servers.nginx import binary as nginx_binary

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


def test_a_zero_byte_file_whose_range_is_unsatisfiable_is_fetched_as_an_empty_file(
    web, run_initializer, tmp_path
):
    url = web.put("/dl/empty.txt", b"")  # the listing's bytes=0-0 gets 416, bytes */0 (RFC 9110)
    out = tmp_path / "out"
    first = fetch(run_initializer, url, out)
    assert first.code == 0, first.output
    assert tree(out) == {"empty.txt": b""}
    assert find_problems(out) == []
    assert read_manifest(out).files["empty.txt"].size == 0
    assert [h.get("Range") for h in web.gets("/dl/empty.txt")] == ["bytes=0-0", None]

    again = fetch(run_initializer, url, out)
    assert again.code == 0, again.output
    assert "already complete" in again.stderr


def test_a_presigned_s3_url_of_an_empty_object_is_fetched_as_an_empty_file(
    bucket, run_initializer, tmp_path
):
    bucket.put("releases/empty.txt", b"")  # S3 (moto) answers its range: 416, no Content-Range
    url = bucket.client.generate_presigned_url(
        "get_object", Params={"Bucket": bucket.name, "Key": "releases/empty.txt"}
    )
    result = fetch(run_initializer, url, tmp_path / "out")
    assert result.code == 0, result.output
    assert tree(tmp_path / "out") == {"empty.txt": b""}


@contextmanager
def unsatisfiable_server(total: int) -> Iterator[str]:
    """A server that answers every range with 416 ``bytes */total`` and a plain GET with
    ``total`` bytes: a broken one, whose 416 does not mean an empty file."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            if "Range" in self.headers:
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{total}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Length", str(total))
            self.end_headers()
            self.wfile.write(b"x" * total)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_416_for_the_first_byte_of_a_file_that_is_not_empty_exits_5(run_initializer, tmp_path):
    with unsatisfiable_server(total=5) as url:
        result = fetch(run_initializer, url + "/model.safetensors", tmp_path / "out")
    assert result.code == 5, result.output
    assert "Traceback" not in result.output
    assert tree(tmp_path / "out") == {}


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


def test_a_url_pinning_a_digest_verifies_the_archive_and_a_wrong_pin_exits_5_with_nothing_kept(
    web, run_initializer, tmp_path
):
    archive = tar_bytes(MODEL)
    url = web.put("/dl/model.tar.gz", archive)
    pinned = f"{url}#sha256={hashlib.sha256(archive).hexdigest().upper()}"
    result = fetch(run_initializer, pinned, tmp_path / "model")
    assert result.code == 0, result.output
    assert tree(tmp_path / "model") == MODEL
    assert all("#" not in path for _, path, _ in web.requests)  # a fragment stays client-side

    wrong = f"{url}#sha512={hashlib.sha512(b'another file').hexdigest()}"
    refused = fetch(run_initializer, wrong, tmp_path / "other")
    assert refused.code == 5, refused.output
    assert "checksum mismatch twice (expected sha512:" in refused.stderr
    assert "Traceback" not in refused.output
    assert tree(tmp_path / "other") == {}


def test_a_new_pin_is_checked_on_the_rerun_not_vouched_for_by_the_earlier_manifest(
    web, run_initializer, tmp_path
):
    body = RNG.randbytes(5 * MIB)
    url = web.put("/dl/weights.safetensors", body)
    out = tmp_path / "model"
    first = fetch(run_initializer, f"{url}#md5={hashlib.md5(body).hexdigest()}", out)
    assert first.code == 0, first.output
    assert tree(out) == {"weights.safetensors": body}
    same = fetch(run_initializer, f"{url}#md5={hashlib.md5(body).hexdigest()}", out)
    assert "already complete" in same.stderr, same.output

    wrong = fetch(run_initializer, f"{url}#sha1={hashlib.sha1(b'not it').hexdigest()}", out)
    assert wrong.code == 5, wrong.output
    assert not (out / ".initializer-manifest.json").exists()  # the tree no longer vouched for


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
        ("https://example.invalid/m.tar.gz#sha256=abc", 2, "the fragment is not a digest"),
        ("https://example.invalid/m.tar.gz#crc32=00000000", 2, "pin its content with #sha256="),
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


# -- against nginx, a real third-party server ------------------------------------------------

PROBE = "bytes=0-0"


@pytest.fixture
def nginx(tmp_path) -> Iterator[Nginx]:
    """A private nginx on 127.0.0.1 serving a temp folder (see tests/servers/nginx.py)."""
    if nginx_binary() is None:
        pytest.skip("nginx is not installed (apt install nginx); the nginx specs need it")
    server = Nginx(tmp_path / "nginx").start()
    try:
        yield server
    finally:
        server.stop()


def test_nginx_sends_a_large_file_in_parallel_ranges_each_pinned_to_its_strong_etag(
    nginx, run_initializer, tmp_path
):
    body = RNG.randbytes(64 * MIB)
    url = nginx.put("/releases/model.safetensors", body)
    out = tmp_path / "model"
    result = fetch(run_initializer, url, out)
    assert result.code == 0, result.output
    assert tree(out) == {"model.safetensors": body}
    assert find_problems(out) == []
    etag = nginx.etag("/releases/model.safetensors")
    assert etag.startswith('"')  # strong: gzip is off
    listing, *ranges = [
        r for r in nginx.requests("/releases/model.safetensors") if r.method == "GET"
    ]
    assert (listing.range, listing.status, listing.if_match) == (PROBE, 206, None)
    assert len(ranges) == 2  # 64 MiB: two 32 MiB ranges
    assert {(r.status, r.if_match) for r in ranges} == {(206, etag)}
    assert sum(r.body_bytes for r in ranges) == len(body)  # no byte sent twice


def test_nginx_a_rerun_against_an_unchanged_file_only_asks_for_its_first_byte(
    nginx, run_initializer, tmp_path
):
    url = nginx.put("/model.safetensors", RNG.randbytes(40 * MIB))
    out = tmp_path / "model"
    assert fetch(run_initializer, url, out).code == 0
    before = len(nginx.requests())
    again = fetch(run_initializer, url, out)
    assert again.code == 0, again.output
    assert "already complete" in again.stderr
    assert nginx.requests()[before:] == [Request("GET", "/model.safetensors", 206, 1, PROBE, None)]


def test_nginx_a_file_replaced_between_runs_is_fetched_again_whole(
    nginx, run_initializer, tmp_path
):
    url = nginx.put("/model.safetensors", RNG.randbytes(40 * MIB))
    out = tmp_path / "model"
    assert fetch(run_initializer, url, out).code == 0
    newer = RNG.randbytes(40 * MIB)  # the same size: only nginx's ETag tells them apart
    nginx.put("/model.safetensors", newer)
    before = len(nginx.requests())
    result = fetch(run_initializer, url, out)
    assert result.code == 0, result.output
    assert tree(out) == {"model.safetensors": newer}
    refetched = [r for r in nginx.requests()[before:] if r.range != PROBE]
    assert sum(r.body_bytes for r in refetched) == len(newer)
    assert {r.if_match for r in refetched} == {nginx.etag("/model.safetensors")}


def test_nginx_a_file_replaced_mid_fetch_fails_with_exit_5_and_the_rerun_gets_the_new_one(
    nginx, run_initializer, tmp_path
):
    path = "/slow/model.safetensors"  # 16 MiB/s a connection: 2 s for each 32 MiB range
    url = nginx.put(path, RNG.randbytes(64 * MIB))
    listed = nginx.etag(path)
    newer = RNG.randbytes(64 * MIB)

    def replace_while_the_first_range_streams() -> None:
        deadline = time.monotonic() + 30
        while not any(r.range == PROBE for r in nginx.requests(path)):
            if time.monotonic() > deadline:
                return
        time.sleep(0.3)  # the first range is on its way; the second is asked for after it
        nginx.put(path, newer)

    replacer = threading.Thread(target=replace_while_the_first_range_streams)
    replacer.start()
    out = tmp_path / "model"
    failed = fetch(run_initializer, url, out, "--workers", "1")  # one range at a time
    replacer.join()
    assert failed.code == 5, failed.output
    assert "changed on the server" in failed.stderr
    assert tree(out) == {}
    assert (412, listed) in {(r.status, r.if_match) for r in nginx.requests(path)}

    rerun = fetch(run_initializer, url, out)
    assert rerun.code == 0, rerun.output
    assert tree(out) == {"model.safetensors": newer}


@pytest.mark.parametrize(
    ("name", "archive"),
    [("model.tar.gz", tar_bytes(MODEL)), ("model.zip", zip_bytes(MODEL))],
)
def test_nginx_serves_archives_that_are_unpacked_into_the_destination(
    name, archive, nginx, run_initializer, tmp_path
):
    url = nginx.put(f"/dl/{name}", archive)
    out = tmp_path / "model"
    result = fetch(run_initializer, url, out)
    assert result.code == 0, result.output
    assert tree(out) == MODEL
    assert find_problems(out) == []
    assert not (out / ".initializer-archive").exists()


def test_nginx_a_zero_byte_file_is_fetched_as_an_empty_file(nginx, run_initializer, tmp_path):
    url = nginx.put("/dl/empty.txt", b"")
    out = tmp_path / "out"
    result = fetch(run_initializer, url, out)
    assert result.code == 0, result.output
    assert tree(out) == {"empty.txt": b""}
    assert find_problems(out) == []
    # nginx ignores the range of an empty file: a 200 without a body, and nothing else asked
    assert [(r.status, r.range) for r in nginx.requests("/dl/empty.txt")] == [(200, PROBE)]
    again = fetch(run_initializer, url, out)
    assert again.code == 0, again.output
    assert "already complete" in again.stderr

"""The initializers against a real S3 server (moto on 127.0.0.1), through the real CLI."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.conftest import ACCESS_KEY, SECRET_KEY, Bucket, clean_env, tree
from tests.servers.faultproxy import FaultProxy
from tests.servers.forward import ForwardProxy

MODEL = {
    "llama/config.json": b'{"hidden_size": 8}',
    "llama/model-00001-of-00002.safetensors": os.urandom(300_000),
    "llama/model-00002-of-00002.safetensors": os.urandom(200_000),
    "llama/tokenizer/tokenizer.json": b'{"vocab": {}}',
    "llama/pytorch_model.bin": b"pickled weights we must not fetch",
    "llama/flax_model.msgpack": b"flax weights we must not fetch",
    "llama-v2/config.json": b'{"sibling": "must not be fetched"}',
}


def fill(bucket: Bucket, files: dict[str, bytes]) -> None:
    for key, body in files.items():
        bucket.put(key, body)


def manifest(dest: Path) -> dict:
    return json.loads((dest / ".initializer-manifest.json").read_text())


def put_small_and_ranged(bucket: Bucket) -> dict[str, bytes]:
    """A small object (whole, on the native path) and one fetched in ranges, put under d/."""
    files = {"d/small.txt": b"small", "d/large.bin": os.urandom(50 << 20)}
    for key, body in files.items():
        bucket.put(key, body)
    return files


def on_plane(plane: str, env: dict[str, str], tmp_path: Path) -> None:
    """Make ``env`` take the S3 control plane ``plane``: static keys take the signed REST
    calls ("signed-rest"); keys from the AWS credentials file take botocore's ("botocore")."""
    if plane == "botocore":
        del env["ACCESS_KEY_ID"], env["SECRET_ACCESS_KEY"]
        (tmp_path / "home" / "no-aws-credentials").write_text(
            f"[default]\naws_access_key_id = {ACCESS_KEY}\naws_secret_access_key = {SECRET_KEY}\n"
        )


def test_env_only_run_as_the_controller_calls_it_fetches_the_model(
    bucket, run_initializer, tmp_path
):
    fill(bucket, MODEL)
    out = tmp_path / "model"
    result = run_initializer("model", env=bucket.env("llama", OUTPUT_PATH=str(out)))
    assert result.code == 0, result.output
    assert tree(out) == {
        "config.json": MODEL["llama/config.json"],
        "model-00001-of-00002.safetensors": MODEL["llama/model-00001-of-00002.safetensors"],
        "model-00002-of-00002.safetensors": MODEL["llama/model-00002-of-00002.safetensors"],
        "tokenizer/tokenizer.json": MODEL["llama/tokenizer/tokenizer.json"],
    }
    recorded = manifest(out)
    assert recorded["source"] == f"s3://{bucket.name}/llama"
    assert set(recorded["files"]) == set(tree(out))
    assert all(entry["checksum"] for entry in recorded["files"].values())


def test_flags_only_run_as_docker_run_would_fetches_the_dataset(bucket, run_initializer, tmp_path):
    fill(bucket, {"data/train/part-0.jsonl": b"a\n", "data/test/part-0.jsonl": b"b\n"})
    out = tmp_path / "dataset"
    result = run_initializer(
        "dataset",
        "--storage-uri",
        bucket.uri("data"),
        "--output",
        str(out),
        "--endpoint",
        bucket.endpoint,
        env={"ACCESS_KEY_ID": ACCESS_KEY, "SECRET_ACCESS_KEY": SECRET_KEY},
    )
    assert result.code == 0, result.output
    assert tree(out) == {"train/part-0.jsonl": b"a\n", "test/part-0.jsonl": b"b\n"}


def test_flags_win_over_env(bucket, run_initializer, tmp_path):
    fill(bucket, {"right/a.txt": b"right", "wrong/a.txt": b"wrong"})
    out = tmp_path / "out"
    env = bucket.env("wrong", OUTPUT_PATH=str(tmp_path / "env-output"))
    result = run_initializer(
        "dataset", "--storage-uri", bucket.uri("right"), "--output", str(out), env=env
    )
    assert result.code == 0, result.output
    assert tree(out) == {"a.txt": b"right"}
    assert not (tmp_path / "env-output").exists()


def test_prefix_matches_on_a_folder_boundary_not_sibling_folders(bucket, run_initializer, tmp_path):
    fill(bucket, {"model/config.json": b"1", "model-v2/config.json": b"2", "modelzoo.json": b"3"})
    result = run_initializer("dataset", env=bucket.env("model", OUTPUT_PATH=str(tmp_path / "o")))
    assert result.code == 0, result.output
    assert tree(tmp_path / "o") == {"config.json": b"1"}


def test_trailing_slash_prefix_is_the_same_folder(bucket, run_initializer, tmp_path):
    fill(bucket, {"model/a/b.txt": b"b", "model-v2/x.txt": b"x"})
    result = run_initializer("dataset", env=bucket.env("model/", OUTPUT_PATH=str(tmp_path)))
    assert result.code == 0, result.output
    assert tree(tmp_path) == {"a/b.txt": b"b"}


def test_a_uri_naming_one_object_fetches_just_that_object(bucket, run_initializer, tmp_path):
    fill(bucket, {"data/train.jsonl": b"row\n", "data/train.jsonl.bak": b"old\n"})
    result = run_initializer(
        "dataset", env=bucket.env("data/train.jsonl", OUTPUT_PATH=str(tmp_path))
    )
    assert result.code == 0, result.output
    assert tree(tmp_path) == {"train.jsonl": b"row\n"}


def test_a_bare_bucket_needs_a_trailing_slash_to_fetch_everything(
    bucket, run_initializer, tmp_path
):
    fill(bucket, {"x.txt": b"x", "d/y.txt": b"y"})
    bare = run_initializer(
        "dataset",
        env={
            **bucket.env(""),
            "STORAGE_URI": f"s3://{bucket.name}",
            "OUTPUT_PATH": str(tmp_path / "a"),
        },
    )
    assert bare.code == 2
    assert f"write s3://{bucket.name}/ to fetch all of it" in bare.stderr
    whole = run_initializer("dataset", env=bucket.env("", OUTPUT_PATH=str(tmp_path / "b")))
    assert whole.code == 0, whole.output
    assert tree(tmp_path / "b") == {"x.txt": b"x", "d/y.txt": b"y"}


def test_model_defaults_apply_when_ignore_patterns_is_unset(bucket, run_initializer, tmp_path):
    fill(bucket, MODEL)
    result = run_initializer("model", env=bucket.env("llama", OUTPUT_PATH=str(tmp_path)))
    assert result.code == 0, result.output
    assert "pytorch_model.bin" not in tree(tmp_path)
    assert "flax_model.msgpack" not in tree(tmp_path)
    assert "weights: *.safetensors found" in result.stderr


def test_model_falls_back_to_bin_weights_when_there_is_no_safetensors(
    bucket, run_initializer, tmp_path
):
    fill(
        bucket,
        {"old/config.json": b"{}", "old/pytorch_model.bin": b"w", "old/flax_model.msgpack": b"f"},
    )
    # The Kubeflow SDK always sends its default ignore list; the fallback must survive it.
    env = bucket.env(
        "old", OUTPUT_PATH=str(tmp_path), IGNORE_PATTERNS="*.msgpack,*.h5,*.bin,*.pt,*.pth"
    )
    result = run_initializer("model", env=env)
    assert result.code == 0, result.output
    assert tree(tmp_path) == {"config.json": b"{}", "pytorch_model.bin": b"w"}
    assert "no *.safetensors in the source; falling back to *.bin" in result.stderr


def test_user_patterns_are_taken_literally(bucket, run_initializer, tmp_path):
    fill(bucket, {"d/a.json": b"1", "d/b.csv": b"2", "d/sub/c.json": b"3", "d/sub/skip.json": b"4"})
    env = bucket.env(
        "d", OUTPUT_PATH=str(tmp_path), ALLOW_PATTERNS="*.json", IGNORE_PATTERNS="sub/skip*"
    )
    result = run_initializer("dataset", env=env)
    assert result.code == 0, result.output
    assert tree(tmp_path) == {"a.json": b"1", "sub/c.json": b"3"}


def test_patterns_that_match_nothing_fail_with_not_found(bucket, run_initializer, tmp_path):
    fill(bucket, {"d/a.csv": b"1"})
    result = run_initializer(
        "dataset", env=bucket.env("d", OUTPUT_PATH=str(tmp_path), ALLOW_PATTERNS="*.parquet")
    )
    assert result.code == 4
    assert "match the allow/ignore patterns" in result.stderr


def test_rerun_into_a_complete_folder_transfers_nothing(bucket, run_initializer, tmp_path):
    fill(bucket, MODEL)
    env = bucket.env("llama", OUTPUT_PATH=str(tmp_path))
    assert run_initializer("model", env=env).code == 0
    before = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.is_file()}
    again = run_initializer("model", env=env)
    assert again.code == 0, again.output
    assert "already complete" in again.stderr and "nothing to fetch" in again.stderr
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.is_file()} == before


def test_a_changed_source_updates_only_what_changed(bucket, run_initializer, tmp_path):
    fill(bucket, {"d/same.txt": b"same", "d/edit.txt": b"v1", "d/gone.txt": b"bye"})
    env = bucket.env("d", OUTPUT_PATH=str(tmp_path))
    assert run_initializer("dataset", env=env).code == 0
    same_mtime = (tmp_path / "same.txt").stat().st_mtime_ns
    (tmp_path / "users-own-notes.txt").write_text("not ours")
    bucket.put("d/edit.txt", b"v2")
    bucket.client.delete_object(Bucket=bucket.name, Key="d/gone.txt")
    bucket.put("d/new.txt", b"new")

    result = run_initializer("dataset", env=env)
    assert result.code == 0, result.output
    assert tree(tmp_path) == {
        "same.txt": b"same",
        "edit.txt": b"v2",
        "new.txt": b"new",
        "users-own-notes.txt": b"not ours",
    }
    assert (tmp_path / "same.txt").stat().st_mtime_ns == same_mtime
    assert "2 fetched" in result.stderr
    assert set(manifest(tmp_path)["files"]) == {"same.txt", "edit.txt", "new.txt"}


def test_a_locally_damaged_file_is_fetched_again(bucket, run_initializer, tmp_path):
    fill(bucket, {"d/a.txt": b"original", "d/b.txt": b"untouched"})
    env = bucket.env("d", OUTPUT_PATH=str(tmp_path))
    assert run_initializer("dataset", env=env).code == 0
    (tmp_path / "a.txt").write_bytes(b"truncat")
    result = run_initializer("dataset", env=env)
    assert result.code == 0, result.output
    assert (tmp_path / "a.txt").read_bytes() == b"original"
    assert "1 fetched" in result.stderr


@pytest.mark.parametrize("algorithm", ["SHA256", "CRC32", "CRC32C", "CRC64NVME"])
def test_s3_additional_checksums_are_verified_and_recorded(
    bucket, run_initializer, tmp_path, algorithm
):
    bucket.put("d/a.bin", b"checksummed", ChecksumAlgorithm=algorithm)
    bucket.put("d/big.bin", os.urandom(80 << 20), ChecksumAlgorithm=algorithm)  # ranged
    result = run_initializer("dataset", env=bucket.env("d", OUTPUT_PATH=str(tmp_path)))
    assert result.code == 0, result.output
    for name in ("a.bin", "big.bin"):
        recorded = manifest(tmp_path)["files"][name]["checksum"]
        assert recorded.startswith(f"s3-{algorithm.lower()}:"), recorded


PLANES = {
    "static-keys": {},  # the signed REST control plane
    "role": {  # botocore's, as every run without an endpoint and static keys
        "ROLE_ARN": "arn:aws:iam::123456789012:role/initializer",
    },
}


def composite_crc32(data: bytes, part: int) -> str:
    """S3's COMPOSITE CRC32 of ``data`` uploaded in ``part``-byte parts: the CRC32 of the
    parts' big-endian CRC32s, base64, then "-N"."""
    crcs = [zlib.crc32(data[i : i + part]).to_bytes(4, "big") for i in range(0, len(data), part)]
    return base64.b64encode(zlib.crc32(b"".join(crcs)).to_bytes(4, "big")).decode() + (
        f"-{len(crcs)}"
    )


@pytest.mark.parametrize("plane", PLANES)
def test_a_multipart_upload_with_boto3_defaults_is_verified_by_the_checksum_of_its_parts(
    bucket, run_initializer, tmp_path, plane
):
    """boto3's upload_file of 20 MiB: 3 parts of 8 MiB, a COMPOSITE CRC32 (the GET sends
    "<b64>-3"). One HEAD of part 1 gives the parts' size; the file is verified against that
    checksum of its parts, which the test computes itself."""
    data = os.urandom(20 << 20)
    source = tmp_path / "upload.bin"
    source.write_bytes(data)
    bucket.client.upload_file(str(source), bucket.name, "m/model.safetensors")
    head = bucket.client.head_object(Bucket=bucket.name, Key="m/model.safetensors")
    assert head["ETag"].endswith('-3"'), head["ETag"]  # it really is multipart
    out = tmp_path / "out"
    env = bucket.env("m", OUTPUT_PATH=str(out), **PLANES[plane])
    if plane == "role":
        env["AWS_ENDPOINT_URL_STS"] = bucket.endpoint
    result = run_initializer("model", env=env)
    assert result.code == 0, result.output
    assert (out / "model.safetensors").read_bytes() == data
    recorded = manifest(out)["files"]["model.safetensors"]["checksum"]
    assert recorded == f"s3-crc32:{composite_crc32(data, 8 << 20)}"


def test_a_multipart_upload_fetched_in_ranges_is_verified_by_its_etag_if_the_head_hides_the_parts(
    bucket, run_initializer, tmp_path
):
    """60 MiB in 8 MiB parts, fetched in two ranges: the checksum comes from a HEAD, and moto's
    HEAD drops the composite's "-8" and type (ambiguous: never taken). The ETag, the MD5 of the
    parts' MD5s, verifies the file instead."""
    data = os.urandom(60 << 20)
    source = tmp_path / "upload.bin"
    source.write_bytes(data)
    bucket.client.upload_file(str(source), bucket.name, "m/model.safetensors")
    parts = [data[i : i + (8 << 20)] for i in range(0, len(data), 8 << 20)]
    etag = hashlib.md5(b"".join(hashlib.md5(p).digest() for p in parts)).hexdigest()
    out = tmp_path / "out"
    result = run_initializer("model", env=bucket.env("m", OUTPUT_PATH=str(out)))
    assert result.code == 0, result.output
    assert (out / "model.safetensors").read_bytes() == data
    assert manifest(out)["files"]["model.safetensors"]["checksum"] == f"md5:{etag}-8"


def test_a_small_object_uploaded_as_one_part_is_verified_by_its_parts_on_the_native_path(
    bucket, run_initializer, tmp_path
):
    """A multipart upload of one 100 KiB part (ETag "...-1"): small enough for the native loop,
    where its one part is the whole object, so no HEAD is needed to know its size."""
    data = os.urandom(100 << 10)
    bucket.put_parts("d/one-part.bin", [data])
    out = tmp_path / "out"
    proxy = FaultProxy(bucket.endpoint).start()  # to see every request the run makes
    try:
        env = bucket.env("d", OUTPUT_PATH=str(out), ENDPOINT=proxy.url)
        result = run_initializer("dataset", env=env)
    finally:
        proxy.stop()
    assert result.code == 0, result.output
    assert (out / "one-part.bin").read_bytes() == data
    assert manifest(out)["files"]["one-part.bin"]["checksum"] == (
        f"s3-crc32:{composite_crc32(data, len(data))}"
    )
    assert not [request for request in proxy.seen if request.startswith("HEAD ")], proxy.seen


def test_parts_of_different_sizes_are_verified_over_their_actual_sizes_without_a_refetch(
    bucket, run_initializer, tmp_path
):
    """Parts of 5 MiB, 6 MiB and 1 KiB: the size inferred from part 1 is wrong for part 2.
    The mismatch this gives is not taken for corruption: each part's size is asked, the file
    verified over them, and nothing is fetched twice."""
    data = os.urandom((11 << 20) + 1024)
    cuts = [(0, 5 << 20), (5 << 20, 11 << 20), (11 << 20, len(data))]
    bucket.put_parts("m/model.safetensors", [data[start:end] for start, end in cuts])
    crcs = b"".join(zlib.crc32(data[a:z]).to_bytes(4, "big") for a, z in cuts)
    composite = base64.b64encode(zlib.crc32(crcs).to_bytes(4, "big")).decode()
    out = tmp_path / "out"
    result = run_initializer("model", env=bucket.env("m", OUTPUT_PATH=str(out)))
    assert result.code == 0, result.output
    assert (out / "model.safetensors").read_bytes() == data
    assert manifest(out)["files"]["model.safetensors"]["checksum"] == f"s3-crc32:{composite}-3"
    assert "parts differ in size" in result.stderr
    assert "fetching it again" not in result.stderr


def test_missing_bucket_exits_4_with_a_clear_reason(bucket, run_initializer, tmp_path):
    env = {
        **bucket.env("x"),
        "STORAGE_URI": "s3://no-such-bucket-here/x",
        "OUTPUT_PATH": str(tmp_path),
    }
    result = run_initializer("dataset", env=env)
    assert result.code == 4
    assert "bucket 'no-such-bucket-here' does not exist" in result.stderr
    assert "Traceback" not in result.output


def test_an_empty_prefix_exits_4(bucket, run_initializer, tmp_path):
    fill(bucket, {"other/a.txt": b"a"})
    result = run_initializer("dataset", env=bucket.env("nothing-here", OUTPUT_PATH=str(tmp_path)))
    assert result.code == 4
    assert "no objects under" in result.stderr


def test_no_credentials_at_all_exits_3_and_suggests_anonymous(bucket, run_initializer, tmp_path):
    fill(bucket, {"d/a.txt": b"a"})
    env = {
        "STORAGE_URI": bucket.uri("d"),
        "ENDPOINT": bucket.endpoint,
        "OUTPUT_PATH": str(tmp_path),
    }
    result = run_initializer("dataset", env=env)
    assert result.code == 3
    assert "--anonymous" in result.stderr


def test_anonymous_requests_are_unsigned_and_work_on_a_public_bucket(
    bucket, run_initializer, tmp_path
):
    bucket.put("pub/a.txt", b"public", ACL="public-read")
    env = {
        "STORAGE_URI": bucket.uri("pub"),
        "ENDPOINT": bucket.endpoint,
        "OUTPUT_PATH": str(tmp_path),
        "ANONYMOUS": "true",
    }
    result = run_initializer("dataset", env=env)
    assert result.code == 0, result.output
    assert tree(tmp_path) == {"a.txt": b"public"}


def test_role_arn_is_assumed_through_sts(bucket, run_initializer, tmp_path):
    fill(bucket, {"d/a.txt": b"via role"})
    env = bucket.env(
        "d",
        OUTPUT_PATH=str(tmp_path),
        ROLE_ARN="arn:aws:iam::123456789012:role/initializer",
        AWS_ENDPOINT_URL_STS=bucket.endpoint,
    )
    result = run_initializer("dataset", env=env)
    assert result.code == 0, result.output
    assert tree(tmp_path) == {"a.txt": b"via role"}


def test_an_unreachable_endpoint_exits_7_after_bounded_retries(run_initializer, tmp_path):
    env = {
        "STORAGE_URI": "s3://bucket/x",
        "ENDPOINT": "http://127.0.0.1:9",
        "ACCESS_KEY_ID": ACCESS_KEY,
        "SECRET_ACCESS_KEY": SECRET_KEY,
        "OUTPUT_PATH": str(tmp_path),
        "RETRIES": "3",
    }
    started = time.monotonic()
    result = run_initializer("dataset", env=env)
    assert result.code == 7, result.output
    assert "after 3 attempts" in result.stderr
    assert time.monotonic() - started < 30


def test_a_destination_that_cannot_be_created_exits_6(bucket, run_initializer, tmp_path):
    fill(bucket, {"d/a.txt": b"a"})
    (tmp_path / "file").write_text("a file, not a folder")
    result = run_initializer("dataset", env=bucket.env("d", OUTPUT_PATH=str(tmp_path / "file/sub")))
    assert result.code == 6
    assert "cannot write" in result.stderr


def test_the_failure_reason_goes_to_the_termination_log(bucket, run_initializer, tmp_path):
    log_file = tmp_path / "termination-log"
    result = run_initializer(
        "dataset",
        env={**bucket.env("x"), "STORAGE_URI": "ftp://b/x", "TERMINATION_LOG": str(log_file)},
    )
    assert result.code == 2
    reason = log_file.read_text()
    assert reason.count("\n") == 1
    assert "unsupported scheme ftp://" in reason
    assert reason.strip() in result.stderr


def test_secrets_never_appear_in_output_manifest_or_termination_log(
    bucket, run_initializer, tmp_path
):
    fill(bucket, {"d/a.txt": b"a"})
    log_file = tmp_path / "termination-log"
    ok = run_initializer(
        "dataset",
        "--debug",
        env=bucket.env("d", OUTPUT_PATH=str(tmp_path / "ok"), LOG_FORMAT="json"),
    )
    bad = run_initializer(
        "dataset",
        "--debug",
        env=bucket.env("missing", OUTPUT_PATH=str(tmp_path / "bad"), TERMINATION_LOG=str(log_file)),
    )
    assert ok.code == 0 and bad.code == 4
    haystack = ok.output + bad.output + log_file.read_text()
    haystack += (tmp_path / "ok" / ".initializer-manifest.json").read_text()
    assert SECRET_KEY not in haystack


def start_fetch_and_wait(env: dict[str, str], journal: Path) -> subprocess.Popen:
    """Start the model initializer; return once its range journal shows real progress."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "initializers.model"], env=env, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if journal.exists() and journal.read_text().count("\n") >= 3:
            return proc
        time.sleep(0.01)
    proc.kill()
    raise AssertionError(f"no progress seen: {proc.communicate()[1]}")


def big_model(bucket: Bucket, tmp_path: Path) -> tuple[bytes, Path, dict[str, str]]:
    body = os.urandom(128 << 20)
    bucket.put("big/weights.safetensors", body)
    out = tmp_path / "out"
    env = clean_env(tmp_path, **bucket.env("big", OUTPUT_PATH=str(out), WORKERS="2"))
    return body, out, env


def assert_rerun_resumes_to(body: bytes, out: Path, env: dict[str, str]) -> None:
    """A rerun keeps the bytes already on disk and completes the file byte for byte."""
    rerun = subprocess.run(
        [sys.executable, "-m", "initializers.model"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert rerun.returncode == 0, rerun.stderr
    assert "resumed" in rerun.stderr
    assert (out / "weights.safetensors").read_bytes() == body


def test_sigkill_midway_then_rerun_resumes_and_keeps_fetched_bytes(bucket, tmp_path):
    body, out, env = big_model(bucket, tmp_path)
    proc = start_fetch_and_wait(env, out / ".weights.safetensors.part.journal")
    proc.kill()
    proc.wait()
    assert not (out / "weights.safetensors").exists()  # never a partial file under its name

    assert_rerun_resumes_to(body, out, env)


def test_sigterm_stops_cleanly_with_exit_143_and_the_rerun_finishes(bucket, tmp_path):
    body, out, env = big_model(bucket, tmp_path)
    proc = start_fetch_and_wait(env, out / ".weights.safetensors.part.journal")
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 143, stderr
    assert time.monotonic() - started < 10
    assert "rerun to resume" in stderr
    assert_rerun_resumes_to(body, out, env)


def test_an_aws_profile_from_the_shared_credentials_file_is_used(bucket, run_initializer, tmp_path):
    fill(bucket, {"d/a.txt": b"via profile"})
    credentials = tmp_path / "credentials"
    credentials.write_text(
        f"[team]\naws_access_key_id = {ACCESS_KEY}\naws_secret_access_key = {SECRET_KEY}\n"
    )
    env = {
        "STORAGE_URI": bucket.uri("d"),
        "ENDPOINT": bucket.endpoint,
        "AWS_PROFILE": "team",
        "AWS_SHARED_CREDENTIALS_FILE": str(credentials),
        "OUTPUT_PATH": str(tmp_path / "o"),
    }
    result = run_initializer("dataset", env=env)
    assert result.code == 0, result.output
    assert tree(tmp_path / "o") == {"a.txt": b"via profile"}


def test_a_web_identity_token_as_irsa_mounts_it_is_exchanged_through_sts(
    bucket, run_initializer, tmp_path
):
    fill(bucket, {"d/a.txt": b"via irsa"})
    token = tmp_path / "token"
    token.write_text("eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW06c2EifQ.c2ln")
    env = {
        "STORAGE_URI": bucket.uri("d"),
        "ENDPOINT": bucket.endpoint,
        "AWS_ENDPOINT_URL_STS": bucket.endpoint,
        "AWS_REGION": "us-east-1",
        "AWS_ROLE_ARN": "arn:aws:iam::123456789012:role/irsa",
        "AWS_WEB_IDENTITY_TOKEN_FILE": str(token),
        "OUTPUT_PATH": str(tmp_path / "o"),
    }
    result = run_initializer("dataset", env=env)
    assert result.code == 0, result.output
    assert tree(tmp_path / "o") == {"a.txt": b"via irsa"}


class _PodIdentityAgent(BaseHTTPRequestHandler):
    """The EKS Pod Identity agent's credential endpoint, on 127.0.0.1: credentials for the
    pod's service-account token, which it must receive as the Authorization header."""

    def do_GET(self) -> None:
        self.server.tokens.append(self.headers.get("Authorization"))  # type: ignore[attr-defined]
        expires = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 3600))
        body = json.dumps({
            "AccessKeyId": "ASIAPODIDENTITY0001",
            "SecretAccessKey": "pod-identity-secret",
            "Token": "pod-identity-session",
            "Expiration": expires,
        }).encode()  # fmt: skip
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_eks_pod_identity_credentials_are_fetched_from_the_agent_with_the_pod_token(
    bucket, run_initializer, tmp_path
):
    """What EKS Pod Identity mounts into a pod: the agent's URI and a token file. The run asks
    the agent (a stand-in on 127.0.0.1) with the token and signs with what it answered."""
    fill(bucket, {"d/a.txt": b"via pod identity"})
    token = tmp_path / "eks-pod-identity-token"
    token.write_text("eyJhbGciOiJSUzI1NiJ9.pod-identity.c2ln")
    agent = ThreadingHTTPServer(("127.0.0.1", 0), _PodIdentityAgent)
    agent.tokens = []  # type: ignore[attr-defined]
    threading.Thread(target=agent.serve_forever, daemon=True).start()
    proxy = FaultProxy(bucket.endpoint).start()  # to read each request's signature
    try:
        env = {
            "STORAGE_URI": bucket.uri("d"),
            "ENDPOINT": proxy.url,
            "AWS_REGION": "us-east-1",
            "AWS_CONTAINER_CREDENTIALS_FULL_URI": (
                f"http://127.0.0.1:{agent.server_address[1]}/v1/credentials"
            ),
            "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE": str(token),
            "OUTPUT_PATH": str(tmp_path / "o"),
        }
        result = run_initializer("dataset", env=env)
    finally:
        proxy.stop()
        agent.shutdown()
    assert result.code == 0, result.output
    assert tree(tmp_path / "o") == {"a.txt": b"via pod identity"}
    assert agent.tokens and set(agent.tokens) == {token.read_text()}  # type: ignore[attr-defined]
    for request in proxy.received:
        assert "Credential=ASIAPODIDENTITY0001/" in request.headers["authorization"]
        assert request.headers["x-amz-security-token"] == "pod-identity-session"
    assert "pod-identity-secret" not in result.output


def test_json_logs_are_one_object_per_line_with_progress_fields(bucket, run_initializer, tmp_path):
    fill(bucket, {"d/a.txt": b"a", "d/b.txt": b"b"})
    env = bucket.env("d", OUTPUT_PATH=str(tmp_path), LOG_FORMAT="json")
    result = run_initializer("dataset", env=env)
    assert result.code == 0, result.output
    records = [json.loads(line) for line in result.stderr.splitlines()]
    assert {"time", "level", "logger", "message"} <= set(records[0])
    assert records[-1]["message"].startswith("dataset: done")


def test_progress_lines_report_files_bytes_rate_and_eta(bucket, run_initializer, tmp_path):
    bucket.put("big/w.safetensors", os.urandom(64 << 20))
    env = bucket.env("big", OUTPUT_PATH=str(tmp_path), PROGRESS_INTERVAL="0.1", WORKERS="1")
    result = run_initializer("model", env=env)
    assert result.code == 0, result.output
    progress = [line for line in result.stderr.splitlines() if "MiB/s, ETA" in line]
    assert progress, result.stderr
    assert " files, " in progress[0] and "%)" in progress[0]


def test_a_terminal_gets_a_live_status_line_redrawn_in_place(bucket, tmp_path):
    import pty

    bucket.put("big/w.safetensors", os.urandom(16 << 20))
    env = clean_env(tmp_path, **bucket.env("big", OUTPUT_PATH=str(tmp_path / "o")))
    pid, fd = pty.fork()
    if pid == 0:  # the child: the initializer, with a TTY on stderr
        os.execve(sys.executable, [sys.executable, "-m", "initializers.model"], env)
    screen = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            break
        if not chunk:
            break
        screen += chunk
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, screen.decode(errors="replace")
    assert b"\rmodel: 1/1 files, 16.00 MiB/16.00 MiB (100%)" in screen


@pytest.mark.parametrize("plane", ["signed-rest", "botocore"])
def test_requester_pays_is_said_and_signed_on_every_request(
    plane, bucket, run_initializer, tmp_path
):
    """``--request-payer requester`` reaches every request a run makes (the listing, a HEAD,
    ranged GETs of a large object, whole GETs of small ones), signed, on both control planes:
    static keys use the signed REST calls, a credentials file botocore's."""
    files = put_small_and_ranged(bucket)
    out = tmp_path / "out"
    proxy = FaultProxy(bucket.endpoint).start()
    try:
        env = bucket.env("d", OUTPUT_PATH=str(out), ENDPOINT=proxy.url, REQUEST_PAYER="requester")
        on_plane(plane, env, tmp_path)
        result = run_initializer("dataset", env=env)
    finally:
        proxy.stop()
    assert result.code == 0, result.output
    assert tree(out) == {key.removeprefix("d/"): body for key, body in files.items()}
    kinds = {
        "listing": [r for r in proxy.received if "list-type=2" in r.query],
        "ranged": [r for r in proxy.received if r.range],
        "whole": [r for r in proxy.received if r.path.endswith("small.txt") and not r.range],
    }
    assert all(kinds.values()), [(r.method, r.path, r.range) for r in proxy.received]
    for request in proxy.received:
        assert request.headers.get("x-amz-request-payer") == "requester", request
        signed = request.headers["authorization"].partition("SignedHeaders=")[2]
        assert "x-amz-request-payer" in signed.split(",")[0].split(";"), request


def test_a_request_payer_other_than_requester_is_refused_with_the_value_named(
    bucket, run_initializer, tmp_path
):
    env = bucket.env("d", OUTPUT_PATH=str(tmp_path / "out"), REQUEST_PAYER="bucket-owner")
    result = run_initializer("dataset", env=env)
    assert result.code == 2, result.output
    assert "REQUEST_PAYER" in result.stderr and "'requester'" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("plane", ["signed-rest", "botocore"])
def test_a_version_id_fetches_that_version_of_the_object_pinned_in_the_manifest(
    plane, bucket, run_initializer, tmp_path
):
    """``s3://bucket/key?versionId=ID`` in a versioned bucket: that version, not the latest,
    on both control planes (a large version too: its ranges ask for it), and the rerun against
    the same URI fetches nothing."""
    s3 = bucket.client
    s3.put_bucket_versioning(Bucket=bucket.name, VersioningConfiguration={"Status": "Enabled"})
    old_weights, old_config = os.urandom(50 << 20), b'{"v": 1}'
    pinned = {
        "config.json": s3.put_object(Bucket=bucket.name, Key="m/config.json", Body=old_config),
        "w.bin": s3.put_object(Bucket=bucket.name, Key="m/w.bin", Body=old_weights),
    }
    bucket.put("m/config.json", b'{"v": 2}')
    bucket.put("m/w.bin", b"newer")
    for name, old in (("config.json", old_config), ("w.bin", old_weights)):
        out = tmp_path / name
        uri = f"{bucket.uri('m/' + name)}?versionId={pinned[name]['VersionId']}"
        env = bucket.env("m", STORAGE_URI=uri, OUTPUT_PATH=str(out))
        on_plane(plane, env, tmp_path)
        first = run_initializer("dataset", env=env)
        assert first.code == 0, first.output
        assert tree(out) == {name: old}
        assert manifest(out)["source"] == uri
        again = run_initializer("dataset", env=env)
        assert again.code == 0 and "already complete" in again.stderr, again.output


def test_a_version_id_on_a_prefix_or_an_unknown_version_is_refused_in_one_line(
    bucket, run_initializer, tmp_path
):
    bucket.client.put_bucket_versioning(
        Bucket=bucket.name, VersioningConfiguration={"Status": "Enabled"}
    )
    bucket.put("m/config.json", b"{}")
    on_prefix = run_initializer(
        "dataset", env=bucket.env("m", STORAGE_URI=f"{bucket.uri('m/')}?versionId=abc",
                                  OUTPUT_PATH=str(tmp_path / "a"))
    )  # fmt: skip
    assert on_prefix.code == 2, on_prefix.output
    assert "versionId names a version of one object" in on_prefix.stderr
    unknown = run_initializer(
        "dataset", env=bucket.env("m", STORAGE_URI=f"{bucket.uri('m/config.json')}?versionId=nope",
                                  OUTPUT_PATH=str(tmp_path / "b"))
    )  # fmt: skip
    assert unknown.code in (2, 4), unknown.output
    assert "Traceback" not in on_prefix.stderr + unknown.stderr
    assert len(unknown.stderr.strip().splitlines()[-1]) < 300


@pytest.mark.parametrize("plane", ["signed-rest", "botocore"])
def test_sse_c_objects_are_read_with_the_customer_key_which_no_output_shows(
    plane, bucket, run_initializer, tmp_path
):
    """Objects uploaded with a customer key (SSE-C): every HEAD and GET of an object sends
    the three SSE-C headers, signed (a listing does not); their ETag is no MD5 of the content,
    so none is taken for one; and the key is in no log line, error or manifest."""
    raw = os.urandom(32)
    key = base64.b64encode(raw).decode()
    files = {"d/small.txt": b"sealed", "d/large.bin": os.urandom(50 << 20)}
    for name, body in files.items():
        bucket.client.put_object(
            Bucket=bucket.name, Key=name, Body=body,
            SSECustomerAlgorithm="AES256", SSECustomerKey=raw,
        )  # fmt: skip
    out = tmp_path / "out"
    proxy = FaultProxy(bucket.endpoint).start()
    try:
        env = bucket.env("d", OUTPUT_PATH=str(out), ENDPOINT=proxy.url, DEBUG="1")
        on_plane(plane, env, tmp_path)
        (tmp_path / "sse-c.key").write_text(key + "\n")
        env["SSE_CUSTOMER_KEY_FILE"] = str(tmp_path / "sse-c.key")
        result = run_initializer("dataset", env=env)
    finally:
        proxy.stop()
    assert result.code == 0, result.output
    assert tree(out) == {name.removeprefix("d/"): body for name, body in files.items()}
    md5 = base64.b64encode(hashlib.md5(raw).digest()).decode()
    reads = [r for r in proxy.received if "list-type=2" not in r.query]
    assert any(r.range for r in reads) and any(not r.range for r in reads)
    for request in reads:
        assert request.headers["x-amz-server-side-encryption-customer-algorithm"] == "AES256"
        assert request.headers["x-amz-server-side-encryption-customer-key"] == key
        assert request.headers["x-amz-server-side-encryption-customer-key-md5"] == md5
        signed = request.headers["authorization"].partition("SignedHeaders=")[2].split(",")[0]
        assert "x-amz-server-side-encryption-customer-key" in signed.split(";"), request
    for request in proxy.received:
        if "list-type=2" in request.query:
            assert "x-amz-server-side-encryption-customer-key" not in request.headers
    recorded = manifest(out)
    assert key not in json.dumps(recorded) and key not in result.output
    assert not any(
        str(record.get("checksum", "")).startswith("md5:") for record in recorded["files"].values()
    )


def test_an_sse_c_key_that_is_not_a_base64_aes_256_key_is_refused_without_showing_it(
    bucket, run_initializer, tmp_path
):
    bad = base64.b64encode(b"sixteen byte key").decode()
    env = bucket.env("d", OUTPUT_PATH=str(tmp_path / "out"), SSE_CUSTOMER_KEY=bad)
    result = run_initializer("dataset", env=env)
    assert result.code == 2, result.output
    assert "256-bit AES key base64-encoded" in result.stderr and bad not in result.output


@pytest.mark.parametrize("plane", ["signed-rest", "botocore"])
def test_virtual_hosted_addressing_puts_the_bucket_in_the_host_on_every_request(
    plane, bucket, run_initializer, tmp_path
):
    """``--addressing-style virtual`` against moto's server, which reads the bucket from the
    Host header: the listing, ranged GETs of a large object and whole GETs of small ones all
    name ``BUCKET.s3.test``, never the bucket in the path. The name is never resolved: a
    forward proxy on 127.0.0.1 (HTTP_PROXY) takes every request to moto."""
    files = put_small_and_ranged(bucket)
    port = urlsplit(bucket.endpoint).port
    proxy = ForwardProxy(port)
    out = tmp_path / "out"
    try:
        env = bucket.env("d", OUTPUT_PATH=str(out), ENDPOINT=f"http://s3.test:{port}",
                         HTTP_PROXY=proxy.url, S3_ADDRESSING_STYLE="virtual")  # fmt: skip
        on_plane(plane, env, tmp_path)
        result = run_initializer("dataset", env=env)
    finally:
        proxy.stop()
    assert result.code == 0, result.output
    assert tree(out) == {key.removeprefix("d/"): body for key, body in files.items()}
    assert {host for _, host, _ in proxy.requests} == {f"{bucket.name}.s3.test:{port}"}
    paths = [path for _, _, path in proxy.requests]
    assert any("list-type=2" in p for p in paths) and "/d/large.bin" in paths
    assert not any(p.startswith(f"/{bucket.name}") for p in paths), paths


def test_an_addressing_style_in_the_aws_config_file_is_honoured_where_botocore_reads_it(
    bucket, run_initializer, tmp_path
):
    bucket.put("d/a.txt", b"a")
    port = urlsplit(bucket.endpoint).port
    proxy = ForwardProxy(port)
    (tmp_path / "home").mkdir(exist_ok=True)
    (tmp_path / "home" / "aws-config").write_text("[default]\ns3 =\n  addressing_style = virtual\n")
    try:
        env = bucket.env("d", OUTPUT_PATH=str(tmp_path / "out"), ENDPOINT=f"http://s3.test:{port}",
                         HTTP_PROXY=proxy.url,
                         AWS_CONFIG_FILE=str(tmp_path / "home" / "aws-config"))  # fmt: skip
        on_plane("botocore", env, tmp_path)
        result = run_initializer("dataset", env=env)
    finally:
        proxy.stop()
    assert result.code == 0, result.output
    assert {host for _, host, _ in proxy.requests} == {f"{bucket.name}.s3.test:{port}"}

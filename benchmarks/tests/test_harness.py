"""The harness's endpoints, checks and measurements, against real nginx and real clients.

Run with ``.bench/venv/bin/python -m pytest benchmarks/tests -q`` (after ``benchmarks/setup.sh``).
The fixture and the endpoints come from ``conftest.py``.
"""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
import time
import urllib.request
import zlib
from pathlib import Path

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError, SSLError

from benchmarks import contenders as contenders_mod
from benchmarks import harness, measure, verify
from benchmarks.contenders import Context, Task
from benchmarks.endpoints import Endpoints
from benchmarks.fixtures import BUCKET, Fixture
from benchmarks.s3api import nginx_etag
from benchmarks.tests.hubrun import snapshot_download_dataset

MiB = 1 << 20
SMALL = "model/config.json"  # single part: FULL_OBJECT CRC32
BIG = "model/model-00002-of-00008.safetensors"  # two 8 MiB parts: COMPOSITE CRC32 "...-2"


@pytest.fixture(scope="module")
def s3(endpoints: Endpoints):  # type: ignore[no-untyped-def]
    return boto3.client(
        "s3",
        endpoint_url=endpoints.s3_url,
        region_name="us-east-1",
        aws_access_key_id="k",
        aws_secret_access_key="s",
    )


def test_listing_pages_through_every_key_in_order(fixture: Fixture, s3) -> None:  # type: ignore[no-untyped-def]
    keys = []
    pages = s3.get_paginator("list_objects_v2").paginate(
        Bucket=BUCKET, Prefix="dataset/", PaginationConfig={"PageSize": 7}
    )
    for page in pages:
        keys += [(o["Key"], o["Size"], o["ETag"]) for o in page.get("Contents", [])]
    expected = sorted(
        (k, o.size, o.etag) for k, o in fixture.objects.items() if k.startswith("dataset/")
    )
    assert keys == expected


def test_listing_with_a_delimiter_groups_folders(s3) -> None:  # type: ignore[no-untyped-def]
    page = s3.list_objects_v2(Bucket=BUCKET, Prefix="dataset/data/", Delimiter="/")
    prefixes = [p["Prefix"] for p in page["CommonPrefixes"]]
    assert prefixes == ["dataset/data/test/", "dataset/data/train/", "dataset/data/validation/"]
    assert "Contents" not in page


def test_etags_have_s3_shapes_md5_or_multipart(fixture: Fixture, s3) -> None:  # type: ignore[no-untyped-def]
    small = s3.head_object(Bucket=BUCKET, Key=SMALL)
    data = fixture.source_path(SMALL).read_bytes()
    assert small["ETag"] == f'"{hashlib.md5(data).hexdigest()}"'
    big = fixture.objects[BIG]  # uploaded in 8 MiB parts
    assert big.size > 8 * MiB
    raw = fixture.source_path(big.key).read_bytes()
    parts = [hashlib.md5(raw[i : i + 8 * MiB]).digest() for i in range(0, len(raw), 8 * MiB)]
    expected = f'"{hashlib.md5(b"".join(parts)).hexdigest()}-{len(parts)}"'
    assert s3.head_object(Bucket=BUCKET, Key=big.key)["ETag"] == expected


def _crc32_b64(data: bytes) -> str:
    return base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()


def _composite_crc32(data: bytes, part: int = 8 * MiB) -> str:
    """What S3 reports for a CRC32 multipart upload: CRC32 of the parts' CRC32 digests, "-N"."""
    digests = [zlib.crc32(data[i : i + part]).to_bytes(4, "big") for i in range(0, len(data), part)]
    return f"{_crc32_b64(b''.join(digests))}-{len(digests)}"


def test_fixture_checksums_are_what_an_sdk_upload_leaves(fixture: Fixture) -> None:
    small = fixture.objects[SMALL]
    data = fixture.source_path(SMALL).read_bytes()
    assert (small.checksum_crc32, small.checksum_type) == (_crc32_b64(data), "FULL_OBJECT")
    big = fixture.objects[BIG]
    assert big.size > 8 * MiB
    data = fixture.source_path(BIG).read_bytes()
    assert (big.checksum_crc32, big.checksum_type) == (_composite_crc32(data), "COMPOSITE")
    assert big.checksum_crc32.endswith("-2")


@pytest.mark.parametrize("version", [1, 2])
def test_listings_report_the_crc32_algorithm_and_type(s3, version: int) -> None:  # type: ignore[no-untyped-def]
    listing = s3.list_objects_v2 if version == 2 else s3.list_objects
    contents = {o["Key"]: o for o in listing(Bucket=BUCKET, Prefix="model/")["Contents"]}
    assert contents[SMALL]["ChecksumAlgorithm"] == ["CRC32"]
    assert contents[SMALL]["ChecksumType"] == "FULL_OBJECT"
    assert contents[BIG]["ChecksumAlgorithm"] == ["CRC32"]
    assert contents[BIG]["ChecksumType"] == "COMPOSITE"
    assert all(o["ChecksumAlgorithm"] == ["CRC32"] for o in contents.values())


def test_whole_get_of_a_small_object_carries_a_crc32_that_botocore_validates(
    fixture: Fixture, s3
) -> None:  # type: ignore[no-untyped-def]
    data = fixture.source_path(SMALL).read_bytes()
    got = s3.get_object(Bucket=BUCKET, Key=SMALL, ChecksumMode="ENABLED")
    assert got["ChecksumCRC32"] == _crc32_b64(data)
    assert got["ChecksumType"] == "FULL_OBJECT"
    # botocore wrapped the body to check the CRC32 as it is read; reading it all passes the check.
    assert type(got["Body"]).__name__ == "StreamingChecksumBody"
    assert got["Body"].read() == data
    head = s3.head_object(Bucket=BUCKET, Key=SMALL, ChecksumMode="ENABLED")
    assert (head["ChecksumCRC32"], head["ChecksumType"]) == (_crc32_b64(data), "FULL_OBJECT")


def test_whole_get_of_a_multipart_object_carries_the_composite_crc32(fixture: Fixture, s3) -> None:  # type: ignore[no-untyped-def]
    data = fixture.source_path(BIG).read_bytes()
    got = s3.get_object(Bucket=BUCKET, Key=BIG, ChecksumMode="ENABLED")
    parts = -(-len(data) // (8 * MiB))
    assert got["ChecksumCRC32"].endswith(f"-{parts}")
    assert got["ChecksumCRC32"] == _composite_crc32(data)
    assert got["ChecksumType"] == "COMPOSITE"
    assert got["Body"].read() == data  # botocore cannot check a "-N" value and does not try
    head = s3.head_object(Bucket=BUCKET, Key=BIG, ChecksumMode="ENABLED")
    assert (head["ChecksumCRC32"], head["ChecksumType"]) == (_composite_crc32(data), "COMPOSITE")


@pytest.mark.parametrize("key", [SMALL, BIG])
def test_ranged_gets_carry_no_checksum(fixture: Fixture, s3, key: str) -> None:  # type: ignore[no-untyped-def]
    got = s3.get_object(Bucket=BUCKET, Key=key, Range="bytes=0-9", ChecksumMode="ENABLED")
    assert got["Body"].read() == fixture.source_path(key).read_bytes()[:10]
    assert "ChecksumCRC32" not in got and "ChecksumType" not in got
    headers = got["ResponseMetadata"]["HTTPHeaders"]
    assert "x-amz-checksum-crc32" not in headers and "x-amz-checksum-type" not in headers


def test_gets_without_checksum_mode_carry_no_checksum(
    fixture: Fixture, endpoints: Endpoints
) -> None:
    # A plain HTTP GET/HEAD: no x-amz-checksum-mode header at all.
    for method in ("GET", "HEAD"):
        request = urllib.request.Request(f"{endpoints.s3_url}/{BUCKET}/{SMALL}", method=method)
        with urllib.request.urlopen(request) as response:
            response.read()
            assert response.headers["ETag"] == fixture.objects[SMALL].etag
            assert response.headers["x-amz-checksum-crc32"] is None
            assert response.headers["x-amz-checksum-type"] is None
    # The header's value is case-insensitive; any other value is no request for checksums.
    for mode, expected in (("enabled", fixture.objects[SMALL].checksum_crc32), ("DISABLED", None)):
        request = urllib.request.Request(
            f"{endpoints.s3_url}/{BUCKET}/{SMALL}", headers={"x-amz-checksum-mode": mode}
        )
        with urllib.request.urlopen(request) as response:
            response.read()
            assert response.headers["x-amz-checksum-crc32"] == expected
    # boto3 asks for checksums by default (response_checksum_validation="when_supported").
    plain = boto3.client(
        "s3",
        endpoint_url=endpoints.s3_url,
        region_name="us-east-1",
        aws_access_key_id="k",
        aws_secret_access_key="s",
        config=Config(response_checksum_validation="when_required"),
    )
    got = plain.get_object(Bucket=BUCKET, Key=SMALL)
    assert got["Body"].read() == fixture.source_path(SMALL).read_bytes()
    assert "ChecksumCRC32" not in got and "ChecksumType" not in got


def test_part_number_gets_from_the_api_layer_carry_checksums_when_asked(
    fixture: Fixture, s3
) -> None:  # type: ignore[no-untyped-def]
    # nginx hands every object request with ?partNumber= or ?versionId= to benchmarks.s3api.
    small, big = fixture.objects[SMALL], fixture.objects[BIG]
    got = s3.get_object(Bucket=BUCKET, Key=SMALL, PartNumber=1, ChecksumMode="ENABLED")
    assert (got["ChecksumCRC32"], got["ChecksumType"]) == (small.checksum_crc32, "FULL_OBJECT")
    assert got["Body"].read() == fixture.source_path(SMALL).read_bytes()  # validated by botocore
    head = s3.head_object(Bucket=BUCKET, Key=BIG, PartNumber=2, ChecksumMode="ENABLED")
    assert (head["ChecksumCRC32"], head["ChecksumType"]) == (big.checksum_crc32, "COMPOSITE")
    assert head["PartsCount"] == 2  # only the API layer sends x-amz-mp-parts-count
    ranged = s3.get_object(
        Bucket=BUCKET, Key=SMALL, Range="bytes=0-9", VersionId="null", ChecksumMode="ENABLED"
    )
    assert ranged["Body"].read() == fixture.source_path(SMALL).read_bytes()[:10]
    assert "ChecksumCRC32" not in ranged and "ChecksumType" not in ranged


def test_object_bytes_come_from_nginx_even_when_presigned(
    fixture: Fixture, endpoints: Endpoints, s3
) -> None:  # type: ignore[no-untyped-def]
    key = "model/model-00001-of-00008.safetensors"
    url = s3.generate_presigned_url("get_object", Params={"Bucket": BUCKET, "Key": key})
    position = endpoints.log_position()
    with urllib.request.urlopen(url) as response:
        body = response.read()
        server = response.headers["Server"]
    assert body == fixture.source_path(key).read_bytes()
    assert server.startswith("nginx")
    traffic = endpoints.traffic_since(position)["s3"]
    assert traffic.data_bytes == len(body)
    # A listing is not file data.
    position = endpoints.log_position()
    s3.list_objects_v2(Bucket=BUCKET, Prefix="model/")
    assert endpoints.traffic_since(position)["s3"].data_bytes == 0


def test_if_match_passes_with_our_etag_and_fails_with_a_stale_one(fixture: Fixture, s3) -> None:  # type: ignore[no-untyped-def]
    key = "model/tokenizer.json"
    good = s3.get_object(
        Bucket=BUCKET, Key=key, Range="bytes=0-9", IfMatch=fixture.objects[key].etag
    )
    assert good["Body"].read() == fixture.source_path(key).read_bytes()[:10]
    with pytest.raises(ClientError) as stale:
        s3.get_object(Bucket=BUCKET, Key=key, IfMatch='"0123456789abcdef0123456789abcdef"')
    assert stale.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412


def test_boto3_download_file_uses_ranged_if_match_gets(
    fixture: Fixture, s3, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    from boto3.s3.transfer import TransferConfig

    key = "model/model-00002-of-00008.safetensors"
    config = TransferConfig(multipart_threshold=MiB, multipart_chunksize=MiB)
    s3.download_file(BUCKET, key, str(tmp_path / "out"), Config=config)
    assert (tmp_path / "out").read_bytes() == fixture.source_path(key).read_bytes()


def test_missing_keys_and_buckets_answer_like_s3(s3) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ClientError) as missing:
        s3.get_object(Bucket=BUCKET, Key="model/absent.json")
    assert missing.value.response["Error"]["Code"] == "NoSuchKey"
    with pytest.raises(ClientError) as bucket:
        s3.list_objects_v2(Bucket="other-bucket")
    assert bucket.value.response["Error"]["Code"] == "NoSuchBucket"
    s3.head_bucket(Bucket=BUCKET)


def test_hub_serves_snapshot_download_with_lfs_bytes_from_the_cdn_port(
    fixture: Fixture, endpoints: Endpoints, tmp_path: Path
) -> None:
    argv, env = snapshot_download_dataset(endpoints.hub_url, tmp_path)
    position = endpoints.log_position()
    subprocess.run(argv, env=env, check=True)
    assert verify.check(tmp_path / "d", fixture, "dataset") == []
    assert endpoints.traffic_since(position)["hub"].data_bytes == fixture.expected_bytes("dataset")
    with open(endpoints.run_dir / "access.log") as log:
        cdn_lines = [line for line in log if f" {endpoints.cdn_port} GET /lfs/" in line]
    assert cdn_lines, "LFS files must be redirected to nginx's CDN port"


def _copy(fixture: Fixture, asset: str, dest: Path) -> None:
    for rel in fixture.expected(asset):
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(fixture.source_path(f"{asset}/{rel}").read_bytes())


def test_verify_accepts_an_exact_copy_and_client_bookkeeping(
    fixture: Fixture, tmp_path: Path
) -> None:
    _copy(fixture, "model", tmp_path)
    (tmp_path / ".initializer-manifest.json").write_text("{}")
    (tmp_path / ".cache" / "huggingface").mkdir(parents=True)
    (tmp_path / ".cache" / "huggingface" / "x.metadata").write_text("x")
    assert verify.check(tmp_path, fixture, "model") == []


@pytest.mark.parametrize("damage", ["missing", "extra", "short", "flipped", "leftover-part"])
def test_verify_reports_every_kind_of_damage(fixture: Fixture, tmp_path: Path, damage: str) -> None:
    _copy(fixture, "model", tmp_path)
    shard = tmp_path / "model-00003-of-00008.safetensors"
    if damage == "missing":
        shard.unlink()
    elif damage == "extra":
        (tmp_path / "pytorch_model.bin").write_bytes(b"skipped by the patterns")
    elif damage == "short":
        with open(shard, "r+b") as f:
            f.truncate(shard.stat().st_size - 1)
    elif damage == "flipped":
        with open(shard, "r+b") as f:  # the last MiB is always compared
            f.seek(shard.stat().st_size - 10)
            f.write(b"X")
    else:
        (tmp_path / ".model-00003-of-00008.safetensors.part").write_bytes(b"half")
    assert verify.check(tmp_path, fixture, "model") != []


def test_measure_counts_the_peak_memory_and_cpu_of_a_whole_process_tree(tmp_path: Path) -> None:
    # A parent that starts two children, each holding 150 MiB for a moment while burning CPU.
    child = (
        "import time; b = bytearray(150 << 20); t = time.process_time()\n"
        "while time.process_time() - t < 0.5: pass\n"
        "time.sleep(0.5)"
    )
    parent = (
        "import subprocess, sys\n"
        f"ps = [subprocess.Popen([sys.executable, '-c', {child!r}]) for _ in range(2)]\n"
        "[p.wait() for p in ps]"
    )
    m = measure.run([sys.executable, "-c", parent], dict(os.environ), tmp_path / "log")
    assert m.returncode == 0
    assert m.peak_rss_mib >= 300  # both children at once, not the largest one alone
    assert m.cpu_s >= 1.0  # the children's CPU, reaped by the parent, is counted


def test_measure_kills_the_tree_once_it_has_written_enough(tmp_path: Path) -> None:
    out = tmp_path / "out.bin"
    writer = (
        "import time\n"
        f"with open({str(out)!r}, 'wb') as f:\n"
        "    for _ in range(400):\n"
        "        f.write(b'x' * (1 << 20)); f.flush(); time.sleep(0.005)"
    )
    m = measure.run(
        [sys.executable, "-c", writer],
        dict(os.environ),
        tmp_path / "log",
        kill_after_written=50 * MiB,
    )
    assert m.killed
    assert 50 * MiB <= m.written_at_kill < 200 * MiB
    assert out.stat().st_size < 400 * MiB


def test_measure_does_not_charge_a_small_tool_with_the_harness_memory(tmp_path: Path) -> None:
    ballast = bytearray(200 << 20)  # this process grows; a forked child's maxrss would inherit it
    ballast[::4096] = b"x" * len(ballast[::4096])
    m = measure.run(["/bin/sleep", "0.3"], dict(os.environ), tmp_path / "log")
    assert m.returncode == 0
    assert m.peak_rss_mib < 20


def test_measure_stops_the_wall_clock_when_the_process_exits_not_at_the_next_poll(
    tmp_path: Path,
) -> None:
    before = time.time()
    m = measure.run(["/bin/sleep", "0.03"], dict(os.environ), tmp_path / "log")
    assert 0.03 <= m.wall_s < 0.1  # the harness polls the tree every 0.1 s
    assert before <= m.started_at <= before + m.wall_s  # on the clock nginx logs with


def test_latency_scenarios_are_named_like_the_others_and_run_by_default() -> None:
    assert "latency-s3-dataset" in harness.DEFAULT_SCENARIOS
    assert "latency-hf-dataset" in harness.DEFAULT_SCENARIOS
    assert harness.parse_scenarios("latency") == ["latency-s3-dataset", "latency-hf-dataset"]
    assert harness.parse_scenarios("latency-s3-model,cold-hf-model") == [
        "latency-s3-model",
        "cold-hf-model",
    ]
    with pytest.raises(ValueError, match="latency"):
        harness.parse_scenarios("slow-s3-model")


def test_the_many_files_scenario_runs_by_default_cold_on_s3_with_ours_and_s5cmd() -> None:
    assert [s for s in harness.DEFAULT_SCENARIOS if s.endswith("-files")] == ["cold-s3-files"]
    assert harness.parse_scenarios("cold-s3-files") == ["cold-s3-files"]
    for other in ("latency-s3-files", "cold-hf-files", "warm-s3-files"):
        with pytest.raises(ValueError, match="files"):
            harness.parse_scenarios(other)
    task = Task("s3", "files", rerun=False)
    names = {c.name for c in contenders_mod.by_names(None) if c.applies(task)}
    assert names == {"ours", "s5cmd"}


def test_the_many_files_fixture_is_small_objects_in_folders(fixture: Fixture) -> None:
    files = fixture.expected("files")
    assert len(files) >= 64
    assert all(1024 <= o.size <= 8192 for o in files.values())
    assert all(rel.startswith("images/class-") for rel in files)


def test_the_nginx_style_port_lists_and_serves_nginx_etags_and_no_checksums(
    fixture: Fixture, endpoints: Endpoints
) -> None:
    plain = boto3.client(
        "s3", endpoint_url=endpoints.nginx_s3_url, region_name="us-east-1",
        aws_access_key_id="k", aws_secret_access_key="s",
    )  # fmt: skip
    listed = {
        o["Key"]: o
        for page in plain.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix="model/")
        for o in page["Contents"]
    }
    big = BIG
    assert set(listed) == {k for k in fixture.objects if k.startswith("model/")}
    assert all("ChecksumAlgorithm" not in o for o in listed.values())
    got = plain.get_object(Bucket=BUCKET, Key=big, ChecksumMode="ENABLED")
    assert got["ETag"] == listed[big]["ETag"] == nginx_etag(fixture.objects[big].size)
    assert not [h for h in got["ResponseMetadata"]["HTTPHeaders"] if h.startswith("x-amz-checksum")]
    assert got["Body"].read() == fixture.source_path(big).read_bytes()
    # nginx's own If-Match: its ETag passes, a stale one gets 412.
    ranged = plain.get_object(Bucket=BUCKET, Key=big, Range="bytes=0-9", IfMatch=got["ETag"])
    assert ranged["Body"].read() == fixture.source_path(big).read_bytes()[:10]
    with pytest.raises(ClientError) as stale:
        plain.get_object(Bucket=BUCKET, Key=big, IfMatch=fixture.objects[big].etag)
    assert stale.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    # A request the API layer answers (a part) says the same.
    part = plain.head_object(Bucket=BUCKET, Key=big, PartNumber=1, ChecksumMode="ENABLED")
    assert part["ETag"] == listed[big]["ETag"] and "ChecksumCRC32" not in part


def test_the_nginx_style_scenarios_are_cold_only_and_run_by_default() -> None:
    assert {"cold-s3nginx-model", "cold-s3nginx-dataset"} <= set(harness.DEFAULT_SCENARIOS)
    task = harness._task("cold-s3nginx-dataset")
    assert (task.source, task.nginx_etags) == ("s3", True)
    with pytest.raises(ValueError, match="nginx"):
        harness.parse_scenarios("warm-s3nginx-model")


def test_the_https_port_serves_the_bucket_to_a_client_that_trusts_the_sessions_ca(
    fixture: Fixture, endpoints: Endpoints
) -> None:
    assert endpoints.tls_s3_url.startswith("https://127.0.0.1:")
    common = dict(region_name="us-east-1", aws_access_key_id="k", aws_secret_access_key="s")
    trusting = boto3.client(
        "s3", endpoint_url=endpoints.tls_s3_url, verify=str(endpoints.ca_bundle), **common
    )
    listed = trusting.list_objects_v2(Bucket=BUCKET, Prefix="model/")["Contents"]
    assert {o["Key"] for o in listed} == {k for k in fixture.objects if k.startswith("model/")}
    # The same S3 flavour as the plain port: S3's ETags and checksums.
    got = trusting.get_object(Bucket=BUCKET, Key=SMALL, ChecksumMode="ENABLED")
    assert got["ETag"] == fixture.objects[SMALL].etag
    assert got["ChecksumCRC32"] == fixture.objects[SMALL].checksum_crc32
    assert got["Body"].read() == fixture.source_path(SMALL).read_bytes()
    # A client that does not trust the session's CA is refused: the port is really TLS.
    untrusting = boto3.client("s3", endpoint_url=endpoints.tls_s3_url, **common)
    with pytest.raises(SSLError):
        untrusting.head_object(Bucket=BUCKET, Key=SMALL)


def test_the_https_scenarios_are_cold_only_run_by_default_and_trust_the_ca(
    fixture: Fixture, endpoints: Endpoints, tmp_path: Path
) -> None:
    assert {"cold-s3tls-model", "cold-s3tls-dataset"} <= set(harness.DEFAULT_SCENARIOS)
    task = harness._task("cold-s3tls-model")
    assert (task.source, task.tls, task.nginx_etags) == ("s3", True, False)
    with pytest.raises(ValueError, match="s3tls"):
        harness.parse_scenarios("latency-s3tls-dataset")
    venv = Path(sys.prefix)
    plain = Context(fixture, endpoints.s3_url, endpoints.hub_url, venv, venv, tmp_path)
    runner = harness.Harness(plain, endpoints, tmp_path / "out")
    ctx = runner._context(task)
    assert ctx.s3_url == endpoints.tls_s3_url
    assert ctx.base_env()["AWS_CA_BUNDLE"] == ctx.base_env()["SSL_CERT_FILE"]
    assert ctx.base_env()["SSL_CERT_FILE"] == str(endpoints.ca_bundle)
    # The other scenarios' clients are told nothing of it.
    assert "SSL_CERT_FILE" not in runner._context(harness._task("cold-s3-model")).base_env()

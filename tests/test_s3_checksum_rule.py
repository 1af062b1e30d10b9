"""Which S3 checksum verifies a whole file: strict where sure, never wrong.

The rule (``initializers.sources.s3.full_object_checksum``) sees what a HEAD or a GET said, in
botocore's HeadObject keys. The cases are the shapes real S3-compatible servers send; the
end-to-end matrix against real servers is ``tests/compat``.
"""

from __future__ import annotations

import pytest

from initializers.sources.base import Checksum
from initializers.sources.s3 import full_object_checksum, parts_checksum, parts_count

SINGLE = '"9e107d9d372bb6826bd81d3542a419d6"'
MULTI = '"5ea0f3b58e1b6e5df1b0bd2d7f4d2f1c-5"'


@pytest.mark.parametrize(
    ("said", "expected"),
    [
        # The server says the checksum covers the whole object: trusted, multipart or not.
        ({"ETag": SINGLE, "ChecksumCRC32": "AAAAAA==", "ChecksumType": "FULL_OBJECT"}, "crc32"),
        (
            {"ETag": MULTI, "ChecksumCRC64NVME": "AAAAAAAAAAA=", "ChecksumType": "FULL_OBJECT"},
            "crc64nvme",
        ),
        # Single-part, no type (older servers, moto's HEAD of a put_object): the value is the
        # object's own.
        ({"ETag": SINGLE, "ChecksumCRC32C": "AAAAAA=="}, "crc32c"),
        (
            {"ETag": SINGLE, "ChecksumSHA256": "47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU="},
            "sha256",
        ),
        # The preferred algorithm wins when several are given.
        ({"ETag": SINGLE, "ChecksumSHA256": "x", "ChecksumCRC32": "AAAAAA=="}, "crc32"),
    ],
)
def test_a_checksum_the_server_vouches_for_verifies_the_whole_file(said, expected):
    found = full_object_checksum(said)
    assert found == Checksum(f"s3-{expected}", said[f"Checksum{expected.upper()}"])


@pytest.mark.parametrize(
    "said",
    [
        # moto's HEAD of a boto3 multipart upload: its GET sends "<b64>-5" and COMPOSITE, the
        # HEAD the bare value and no type. A multipart ETag without FULL_OBJECT is ambiguous.
        {"ETag": MULTI, "ChecksumCRC32": "q2ZJVw=="},
        {"ETag": MULTI, "ChecksumCRC32": "q2ZJVw==-5", "ChecksumType": "COMPOSITE"},
        # Composite said outright, even on a single-part ETag.
        {"ETag": SINGLE, "ChecksumCRC32": "q2ZJVw==", "ChecksumType": "COMPOSITE"},
        # A "-N" value is a checksum of checksums, whatever the type says.
        {"ETag": SINGLE, "ChecksumCRC32C": "q2ZJVw==-3"},
        {"ETag": MULTI, "ChecksumCRC32": "q2ZJVw==-3", "ChecksumType": "FULL_OBJECT"},
        # No ETag and no type: nothing says the value is the whole object's.
        {"ChecksumCRC32": "q2ZJVw=="},
        # Nothing to verify.
        {"ETag": SINGLE},
        {},
    ],
)
def test_an_ambiguous_or_composite_checksum_is_never_taken_for_the_whole_file(said):
    assert full_object_checksum(said) is None


@pytest.mark.parametrize(
    ("said", "expected"),
    [
        # A GET of a boto3 multipart upload (moto, SeaweedFS, S3): the value ends in the
        # object's "-N".
        ({"ChecksumCRC32": "q2ZJVw==-5", "ChecksumType": "COMPOSITE"}, ("s3-crc32", "q2ZJVw==-5")),
        ({"ChecksumCRC32C": "q2ZJVw==-5"}, ("s3-crc32c", "q2ZJVw==-5")),
        # COMPOSITE said outright without the "-N": the parts' count is the ETag's.
        ({"ChecksumCRC32": "q2ZJVw==", "ChecksumType": "COMPOSITE"}, ("s3-crc32", "q2ZJVw==-5")),
    ],
)
def test_a_checksum_of_the_parts_is_taken_where_it_surely_is_one(said, expected):
    assert parts_checksum(said, 5) == expected


@pytest.mark.parametrize(
    "said",
    [
        # moto's HEAD: the bare value, no type. It may be of the whole object or of the parts.
        {"ChecksumCRC32": "q2ZJVw=="},
        # Another count of parts than the ETag's: not this object's parts.
        {"ChecksumCRC32": "q2ZJVw==-3", "ChecksumType": "COMPOSITE"},
        # A checksum of the whole object is not one of the parts (full_object_checksum's).
        {"ChecksumCRC64NVME": "AAAAAAAAAAA=", "ChecksumType": "FULL_OBJECT"},
        {},
    ],
)
def test_a_value_that_may_not_be_of_the_parts_is_never_taken_for_one(said):
    assert parts_checksum(said, 5) is None


def test_the_parts_count_is_read_from_a_multipart_etag_only():
    assert parts_count("5ea0f3b58e1b6e5df1b0bd2d7f4d2f1c-5") == 5
    assert parts_count("9e107d9d372bb6826bd81d3542a419d6") == 0
    assert parts_count(None) == 0

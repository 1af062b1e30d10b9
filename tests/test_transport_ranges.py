"""A ranged GET's bytes are written where ``Content-Range`` says they belong, or not at all."""

from __future__ import annotations

import pytest

from initializers.errors import IntegrityError
from initializers.httpstatus import check_range

MIB = 1 << 20


@pytest.mark.parametrize(
    ("status", "content_range", "start", "end"),
    [
        (206, "bytes 0-1048575/4194304", 0, MIB),
        (206, "bytes 1048576-2097151/4194304", MIB, 2 * MIB),
        (206, "bytes 1048576-2097151/*", MIB, 2 * MIB),  # length unknown to the server
        (206, "bytes 1048576-4194303/4194304", MIB, 2 * MIB),  # more than asked: we read less
        # rclone's `serve s3` answers a range with 200 and a correct Content-Range.
        (200, "bytes 1048576-2097151/4194304", MIB, 2 * MIB),
        # A server that ignores ranges sends the whole file: from 0 that is still right.
        (200, "", 0, MIB),
    ],
)
def test_a_body_that_starts_where_asked_is_accepted(status, content_range, start, end):
    headers = {"Content-Range": content_range} if content_range else {}
    check_range(status, headers, start, end, "f.bin")


@pytest.mark.parametrize(
    ("status", "content_range", "start", "end", "message"),
    [
        (200, "", MIB, 2 * MIB, "ignored the byte range"),  # the whole file, from byte 0
        (206, "", MIB, 2 * MIB, "without a valid Content-Range"),
        (206, "bytes=1048576-2097151", MIB, 2 * MIB, "without a valid Content-Range"),
        (206, "bytes 0-1048575/4194304", MIB, 2 * MIB, "sent bytes 0-1048575"),
        (206, "bytes 1048576-1048600/4194304", MIB, 2 * MIB, "sent bytes 1048576-1048600"),
        (200, "bytes 0-4194303/4194304", MIB, 2 * MIB, "sent bytes 0-4194303"),
    ],
)
def test_a_body_placed_elsewhere_is_refused_before_a_byte_is_written(
    status, content_range, start, end, message
):
    headers = {"Content-Range": content_range} if content_range else {}
    with pytest.raises(IntegrityError, match=message):
        check_range(status, headers, start, end, "f.bin")

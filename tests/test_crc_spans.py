"""A file's CRC put together from ranges that land in any order (initializers.crcspans).

The value must be exactly what one pass over the file in order gives (``new_digest``), for a
whole-object checksum and for a multipart object's composite, whatever the order of the ranges,
however the chunks fall across part boundaries, and whatever bytes were never offered (those are
read from the file).
"""

from __future__ import annotations

import os
import random

import pytest

from initializers.checksum import new_digest
from initializers.crcspans import CrcSpans, combines

ALGORITHMS = ["s3-crc32", "s3-crc32c", "crc32c", "s3-crc64nvme"]


def in_order(algorithm: str, data: bytes, parts: list[int]) -> str:
    digest = new_digest(algorithm, len(data), parts)
    digest.update(data)
    return digest.finish()


def shuffled_spans(size: int, count: int, seed: int) -> list[tuple[int, int]]:
    cuts = sorted(random.Random(seed).sample(range(1, size), count - 1))
    spans = list(zip([0, *cuts], [*cuts, size], strict=True))
    random.Random(seed + 1).shuffle(spans)
    return spans


def offer_span(spans: CrcSpans, data: bytes, start: int, end: int, chunk: int = 1000) -> None:
    for offset in range(start, end, chunk):
        spans.offer(memoryview(data[offset : min(offset + chunk, end)]), offset)


@pytest.fixture
def file_of(tmp_path):
    opened: list[int] = []

    def make(data: bytes) -> int:
        path = tmp_path / f"f{len(opened)}"
        path.write_bytes(data)
        opened.append(os.open(path, os.O_RDONLY))
        return opened[-1]

    yield make
    for fd in opened:
        os.close(fd)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("parts", [[], [7000, 7000, 6000]], ids=["whole-object", "composite"])
@pytest.mark.parametrize("seed", range(3))
def test_ranges_offered_in_any_order_give_the_crc_of_one_pass_in_order(
    algorithm, parts, seed, file_of
):
    data = random.Random(seed).randbytes(20_000)
    fd = file_of(data)
    spans = CrcSpans(algorithm, len(data), parts)
    for start, end in shuffled_spans(len(data), 6, seed):
        offer_span(spans, data, start, end, chunk=997)  # chunks straddle the part boundaries
        spans.span_done(fd, start, end)
    assert spans.finish(fd) == in_order(algorithm, data, parts)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_a_file_whose_every_byte_was_offered_is_not_read_back(algorithm, file_of):
    data = os.urandom(50_000)
    fd = file_of(b"\0" * len(data))  # read back, it would give another value
    spans = CrcSpans(algorithm, len(data), [20_000, 30_000])
    for start, end in shuffled_spans(len(data), 5, seed=11):
        offer_span(spans, data, start, end)
    assert spans.finish(fd) == in_order(algorithm, data, [20_000, 30_000])


@pytest.mark.parametrize("parts", [[], [10_000, 10_000, 10_000]], ids=["whole-object", "composite"])
def test_bytes_never_offered_are_read_from_the_file(parts, file_of):
    # Kept on disk by an earlier run, or written before a failure cut the offer short.
    data = os.urandom(30_000)
    fd = file_of(data)
    spans = CrcSpans("s3-crc64nvme", len(data), parts)
    offer_span(spans, data, 2_000, 9_000)
    offer_span(spans, data, 15_000, 16_500)
    offer_span(spans, data, 25_000, 30_000)
    assert spans.finish(fd) == in_order("s3-crc64nvme", data, parts)


def test_a_range_offered_again_from_its_start_replaces_what_its_first_attempt_offered(file_of):
    # A source that cannot resume a range fetches it again from its start.
    data = os.urandom(12_000)
    fd = file_of(data)
    spans = CrcSpans("s3-crc32", len(data))
    offer_span(spans, os.urandom(len(data)), 4_000, 7_000)  # the first attempt's, since rewritten
    offer_span(spans, data, 4_000, 8_000)
    offer_span(spans, data, 0, 4_000)
    offer_span(spans, data, 8_000, 12_000)
    assert spans.finish(fd) == in_order("s3-crc32", data, [])


def test_a_range_offered_again_after_it_had_continued_the_one_before_counts_its_new_bytes(file_of):
    # Its first attempt continued the piece of the range before it; what it offered then must
    # not stand for the bytes its second attempt wrote over.
    data = os.urandom(8_000)
    fd = file_of(data)
    spans = CrcSpans("s3-crc32", len(data))
    offer_span(spans, data, 0, 4_000)
    offer_span(spans, os.urandom(len(data)), 4_000, 7_000)  # first attempt, rewritten since
    offer_span(spans, data, 4_000, 8_000)
    assert spans.finish(fd) == in_order("s3-crc32", data, [])


def test_an_empty_file_has_the_crc_of_nothing(file_of):
    fd = file_of(b"")
    assert CrcSpans("s3-crc32c", 0).finish(fd) == in_order("s3-crc32c", b"", [])


def test_only_crcs_are_put_together_and_hashes_keep_their_order():
    assert all(combines(algorithm) for algorithm in ALGORITHMS)
    assert not any(combines(a) for a in ("sha256", "md5", "s3-sha256", "crc32c+md5-base64"))

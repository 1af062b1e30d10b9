"""Pure building blocks: safe remote names, glob selection, resume intervals, digests."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import random
import threading
import zlib

import pytest

from initializers.checksum import SpanDigest, digest_file, is_supported, new_digest
from initializers.filetable import as_table
from initializers.fsutil import UnsafePathError, safe_relpath
from initializers.journal import CommitLog, RangeJournal, holes, merge
from initializers.manifest import FileRecord
from initializers.patterns import is_selected
from initializers.selection import Chooser, Rules
from initializers.sources.base import Listing, Order, RemoteFile


@pytest.mark.parametrize(
    "name",
    [
        "a.txt",
        "dir/sub/file.bin",
        "ünïcode/名前.json",
        "with space.txt",
        ".hidden/config",
        "nb\xa0sp",
        "d/" + "n" * 241,
        "d/" + "名" * 80,  # 240 bytes
    ],
)
def test_ordinary_names_are_kept_as_relative_paths(name):
    assert safe_relpath(name) == name


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("../escape", "'..'"),
        ("a/../../b", "'..'"),
        ("/etc/passwd", "absolute"),
        ("a\\b", "backslash"),
        ("bad\nname", "control character"),
        ("x/\x00", "control"),
        ("c1\x85next-line", "control character"),
        ("c1\x9fend", "control character"),
        ("a//b", "empty components"),
        ("./a", "'.'"),
        ("d/" + "n" * 300, "longer than 241 bytes"),
        ("d/" + "名" * 81, "longer than 241 bytes"),  # 81 characters, 243 bytes
        ("folder/", "names a folder"),
        (".initializer-manifest.json", "bookkeeping"),
        ("x/.model.safetensors.part", "bookkeeping"),
    ],
)
def test_unsafe_names_are_refused_with_the_reason(name, why):
    with pytest.raises(UnsafePathError, match=None) as error:
        safe_relpath(name)
    assert why in str(error.value)


def test_globs_cross_folders_and_a_trailing_slash_means_a_folder():
    assert is_selected("sub/config.json", ("*.json",), ())
    assert is_selected("train/a.parquet", ("train/",), ())
    assert not is_selected("test/a.parquet", ("train/",), ())
    assert not is_selected("a.bin", (), ("*.bin",))
    assert is_selected("anything", (), ())


def remote(path: str, size: int = 1) -> RemoteFile:
    return RemoteFile(path, size, "v")


EVERYTHING = Rules()


def chooser(paths: list[str], rules: Rules = EVERYTHING, order: Order = Order.UNKNOWN) -> Chooser:
    """A chooser over a complete listing of ``paths``."""
    return Chooser(Listing(None, as_table([remote(p) for p in paths]), order=order), rules)


def test_a_key_that_is_also_a_folder_is_skipped_as_a_conflict():
    choice = chooser(["a", "a/b", "c"])
    assert [f.path for f in choice.chosen_table()] == ["a/b", "c"]
    assert choice.conflicts == ["a"]


def test_a_key_that_is_a_folder_at_any_depth_is_a_conflict_whatever_the_listing_order():
    paths = ["a/b/c/d", "a/b", "a/b/c/e", "a/x", "x", "a/b/c", "y/z"]
    for listed, order in (
        (paths, Order.UNKNOWN),
        (paths[::-1], Order.UNKNOWN),
        (sorted(paths), Order.KEYS),
    ):
        choice = chooser(listed, order=order)
        chosen = sorted(f.path for f in choice.chosen_table())
        assert sorted(choice.conflicts) == ["a/b", "a/b/c"]
        assert chosen == ["a/b/c/d", "a/b/c/e", "a/x", "x", "y/z"]


def test_model_weight_fallback_only_replaces_default_patterns():
    paths = ["config.json", "pytorch_model.bin"]
    allow, ignore, fallback = ("*.json", "*.safetensors"), ("*.bin", "*.msgpack"), ("*.bin",)
    default = chooser(paths, Rules(allow, ignore, fallback, patterns_are_default=True))
    assert [f.path for f in default.chosen_table()] == ["config.json", "pytorch_model.bin"]
    assert default.weights_note and "falling back" in default.weights_note
    custom = chooser(paths, Rules(allow, ignore, fallback, patterns_are_default=False))
    assert [f.path for f in custom.chosen_table()] == ["config.json"]


def test_resume_intervals_merge_and_leave_only_the_holes():
    done = [(0, 10), (10, 20), (50, 60), (55, 70)]
    assert merge(done) == [(0, 20), (50, 70)]
    assert holes(done, 100) == [(20, 50), (70, 100)]
    assert holes([], 5) == [(0, 5)]
    assert holes([(0, 5)], 5) == []


@pytest.fixture
def sample(tmp_path):
    data = os.urandom(5 << 20) + b"tail"
    path = tmp_path / "f"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    yield fd, data
    os.close(fd)


def test_a_journal_closed_by_two_threads_at_once_closes_its_descriptor_once(tmp_path, monkeypatch):
    journal = RangeJournal(tmp_path / ".f.part.journal", {"size": 8, "version": "v"})
    journal.open(fresh=True)
    journal.record(0, 4)
    closes: list[int] = []
    first_inside, let_first_finish = threading.Event(), threading.Event()
    real_close = os.close

    def close(fd: int) -> None:
        """The first close of the journal waits inside until the second closer has run."""
        closes.append(fd)
        if len(closes) == 1:
            first_inside.set()
            let_first_finish.wait(10)
        real_close(fd)

    monkeypatch.setattr(os, "close", close)
    first = threading.Thread(target=journal.close)
    first.start()
    assert first_inside.wait(10)
    second = threading.Thread(target=journal.close)  # while the first is mid-close
    second.start()
    second.join(10)
    let_first_finish.set()
    first.join(10)
    monkeypatch.undo()

    assert len(closes) == 1  # the second closer found nothing left to close
    journal.record(4, 8)  # a late record after the close writes nowhere
    assert journal.load() == [(0, 4)]


def test_digests_match_what_the_sources_announce(sample):
    fd, data = sample
    size = len(data)
    assert digest_file(fd, size, "md5") == hashlib.md5(data).hexdigest()
    assert digest_file(fd, size, "sha256") == hashlib.sha256(data).hexdigest()
    git = hashlib.sha1(b"blob %d\0" % size + data).hexdigest()
    assert digest_file(fd, size, "git-sha1") == git
    crc = base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()
    assert digest_file(fd, size, "s3-crc32") == crc
    sha = base64.b64encode(hashlib.sha256(data).digest()).decode()
    assert digest_file(fd, size, "s3-sha256") == sha


def parts_of(data: bytes, sizes: list[int]) -> list[bytes]:
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    return [data[start : start + size] for start, size in zip(starts, sizes, strict=True)]


@pytest.mark.parametrize("sizes", [[4096, 4096, 1000], [3000, 5000, 1192], [9192]])
def test_a_multipart_objects_digest_of_its_parts_is_s3s_etag_and_composite_checksum(sample, sizes):
    # S3's multipart ETag is the MD5 of the parts' binary MD5s, "-N"; a COMPOSITE checksum the
    # same of the parts' big-endian CRCs, base64. Computed here from the parts, fed in order,
    # streamed in chunks across part boundaries, and read back from disk.
    fd, data = sample
    data = data[: sum(sizes)]
    parts = parts_of(data, sizes)
    etag = hashlib.md5(b"".join(hashlib.md5(p).digest() for p in parts)).hexdigest()
    crcs = b"".join(zlib.crc32(p).to_bytes(4, "big") for p in parts)
    composite = base64.b64encode(zlib.crc32(crcs).to_bytes(4, "big")).decode()
    n = len(sizes)
    assert digest_file(fd, len(data), "md5", sizes) == f"{etag}-{n}"
    assert digest_file(fd, len(data), "s3-crc32", sizes) == f"{composite}-{n}"
    streamed = new_digest("s3-crc32", len(data), sizes)
    for offset in range(0, len(data), 700):
        streamed.update(data[offset : offset + 700])
    assert streamed.finish() == f"{composite}-{n}"
    spans = SpanDigest("md5", len(data), sizes)
    for start, end in spans_of(len(data), 4, seed=3):
        spans.span_done(fd, start, end)
    assert spans.finish(fd) == f"{etag}-{n}"


def spans_of(size, count, seed):
    """``count`` spans that partition ``[0, size)``, in a shuffled order."""
    cuts = sorted(random.Random(seed).sample(range(1, size), count - 1))
    spans = list(zip([0, *cuts], [*cuts, size], strict=True))
    random.Random(seed + 1).shuffle(spans)
    return spans


@pytest.mark.parametrize("seed", range(5))
def test_a_file_whose_ranges_finish_out_of_order_is_digested_as_if_read_once(sample, seed):
    fd, data = sample
    digest = SpanDigest("sha256", len(data))
    spans = spans_of(len(data), 12, seed)
    threads = [
        threading.Thread(target=digest.span_done, args=(fd, start, end)) for start, end in spans
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert digest.finish(fd) == hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("seed", range(5))
def test_chunks_offered_while_spans_stream_in_parallel_give_the_digest_of_the_file(sample, seed):
    fd, data = sample
    digest = SpanDigest("sha256", len(data))

    def stream(start, end):  # a worker: its span in small chunks, each offered, then reported
        for offset in range(start, end, 4096):
            digest.offer(memoryview(data)[offset : min(offset + 4096, end)], offset)
        digest.span_done(fd, start, end)

    threads = [threading.Thread(target=stream, args=span) for span in spans_of(len(data), 8, seed)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert digest.finish(fd) == hashlib.sha256(data).hexdigest()


def test_a_chunk_offered_out_of_order_is_not_digested_until_its_span_is_read_back(sample):
    fd, data = sample
    digest = SpanDigest("md5", len(data))
    half = len(data) // 2
    digest.offer(memoryview(data)[half:], half)  # ahead of the digest: must be ignored
    digest.offer(memoryview(data)[:half], 0)  # next in order: digested as it streams
    digest.span_done(fd, 0, half)
    digest.span_done(fd, half, len(data))

    assert digest.finish(fd) == hashlib.md5(data).hexdigest()


def test_a_span_never_reported_is_read_back_when_the_digest_finishes(sample):
    fd, data = sample
    digest = SpanDigest("git-sha1", len(data))
    for start, end in spans_of(len(data), 6, seed=7)[:-1]:
        digest.span_done(fd, start, end)

    assert digest.finish(fd) == hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def test_unknown_algorithms_are_reported_unsupported():
    assert not is_supported("whirlpool")
    assert is_supported("md5") and is_supported("git-sha1")


TRICKY_RECORDS = [
    ("plain.bin", FileRecord(1, "sha256:ab12", '"e-tag"', 1765000000123456789)),
    ('ünïcode/名前 "q".json', FileRecord(0, None, None, 0)),
    ("tab\tback\\slash", FileRecord(2**40, "crc32:AAA=", "v\u2028x", -1)),
]


@pytest.mark.parametrize(("path", "record"), TRICKY_RECORDS)
def test_a_records_json_text_is_exactly_what_json_dumps_writes(path, record):
    assert record.to_json() == json.dumps(record._asdict())
    assert json.loads(record.to_json()) == record._asdict()


def test_a_commit_log_skips_torn_and_foreign_lines_and_keeps_every_other_record(tmp_path):
    # A kill mid-write leaves a torn line, which the next run's first write then continues;
    # reading many lines at once must give what reading them one at a time gives.
    log = CommitLog(tmp_path)
    log.append_all(dict(TRICKY_RECORDS[:2]))
    with open(log.path, "ab") as stream:
        stream.write(b'{"path": "torn.bin", "size": ')  # no newline: the kill came here
    later = CommitLog(tmp_path)
    later.append_all(dict(TRICKY_RECORDS[2:]))
    with open(log.path, "ab") as stream:
        stream.write(b"42\n[1\n2]\n\n")  # foreign lines; two of them join in one array
    later.append_all({"last.bin": FileRecord(7, None, "v", 1)})
    # The torn line ran into the next run's first line (which boot wrote what follows).
    assert dict(CommitLog(tmp_path).records()) == {
        **dict(TRICKY_RECORDS),
        "last.bin": FileRecord(7, None, "v", 1),
    }

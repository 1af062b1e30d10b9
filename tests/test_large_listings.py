"""What keeps a run of many files cheap: listings taken page by page into a table on disk, a plan
whose memory does not grow with the file count, and a manifest written and read a line at a time."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest

from initializers.config import AssetDefaults, load_settings
from initializers.filejob import FileJob
from initializers.manifest import (
    LINES_PER_PIECE,
    FileRecord,
    Manifest,
    read_manifest_file,
    write_manifest_file,
)
from initializers.retry import RetryPolicy
from initializers.sources import open_source
from initializers.sources.base import Checksum, RemoteFile
from initializers.sources.prefix import Entry, list_prefix
from tests.conftest import clean_env


def test_the_manifest_holds_one_file_per_line_sorted_and_reads_back(tmp_path):
    files = {
        "b/weights.bin": FileRecord(3, "sha256:ab", "v2", 7),
        "a.json": FileRecord(1, None, None, 5),
        'ü "quoted".txt': FileRecord(2, "crc32:AAAAAA==", "e1", 6),
    }
    manifest = Manifest("s3://bucket/prefix", "rev", files)
    path = tmp_path / "manifest.json"
    write_manifest_file(path, manifest)
    text = path.read_text()
    lines = text.splitlines()
    assert lines[1].startswith('"a.json": {"size": 1')
    assert lines[2].startswith('"b/weights.bin": {"size": 3')
    assert lines[3].startswith('"\\u00fc \\"quoted\\".txt": {"size": 2')
    assert json.loads(text)["files"]["b/weights.bin"] == {
        "size": 3,
        "checksum": "sha256:ab",
        "version": "v2",
        "mtime_ns": 7,
    }
    assert read_manifest_file(path) == manifest
    write_manifest_file(path, Manifest("s3://bucket/prefix", None, {}))
    assert json.loads(path.read_text())["files"] == {}


@pytest.mark.parametrize("count", [LINES_PER_PIECE - 1, LINES_PER_PIECE, 2 * LINES_PER_PIECE + 1])
def test_a_manifest_written_in_pieces_is_one_document_with_a_line_per_file(count, tmp_path):
    files = {f"d/{i:05d}.jpg": FileRecord(i, None, f"e{i}", i) for i in range(count)}
    path = tmp_path / "manifest.json"
    write_manifest_file(path, Manifest("s3://bucket/d", None, files))
    assert len(path.read_text().splitlines()) == count + 2
    assert read_manifest_file(path) == Manifest("s3://bucket/d", None, files)


PLAN_AND_TRACE = """
import json, sys, threading, tracemalloc
from pathlib import Path
from initializers.filetable import FileTable
from initializers.journal import CommitLog
from initializers.manifest import FileRecord, manifest_path, write_manifest_records
from initializers.planning import Destination, Plan
from initializers.selection import Chooser
from initializers.sources.base import Listing, Order, RemoteFile

dest, count = Path(sys.argv[1]), int(sys.argv[2])
def remote(i):
    return RemoteFile(f"d/{i // 500:04d}/{i:07d}.jpg", 1000 + i % 7, f"e{i}")
# An earlier run's manifest records every other file (whose bytes are gone since).
write_manifest_records(
    manifest_path(dest), "s3://bucket/d", None,
    ((remote(i).path, FileRecord(remote(i).size, None, f"e{i}", 0)) for i in range(0, count, 2)),
)
tracemalloc.start()
listing = FileTable()
listing.extend(remote(i) for i in range(count))
chooser = Chooser(Listing(None, listing, order=Order.KEYS))
where = Destination(dest, manifest_path(dest), CommitLog(dest), "d")
planned = Plan(where, chooser, "s3://bucket/d", None, threading.Event())
planned.advance(done=True)
jobs = sum(len(window) for window in planned.windows())
peak = tracemalloc.get_traced_memory()[1]
print(json.dumps({"peak": peak, "jobs": jobs, "listed": len(listing)}))
"""


def _traced(script: str, tmp_path, count: int) -> dict:
    """What ``script`` prints (JSON) run in a fresh interpreter on ``count`` files."""
    folder = tmp_path / str(count)
    folder.mkdir()
    ran = subprocess.run(
        [sys.executable, "-c", script, str(folder), str(count)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(ran.stdout)


def test_listing_selecting_and_planning_take_no_more_memory_for_more_files(tmp_path):
    """A million-key prefix must not take a pod's memory: the listing, the selection, the
    earlier run's records and the plan live in a scratch table, and the jobs come a window at
    a time. Python's own allocations (tracemalloc, not a clock: deterministic) at 20,000 and
    at 100,000 files; held in memory, the second took five times the first."""
    small, large = (
        _traced(PLAN_AND_TRACE, tmp_path, 20_000),
        _traced(PLAN_AND_TRACE, tmp_path, 100_000),
    )
    assert (small["listed"], large["listed"]) == (20_000, 100_000)
    # Every other file has an earlier record, looked up and found gone from the disk.
    assert (small["jobs"], large["jobs"]) == (20_000, 100_000)
    assert large["peak"] < 2 * small["peak"], (small, large)


def test_entries_become_remote_files_as_their_page_arrives_not_after_the_last():
    made: list[str] = []
    asked: list[tuple[int, int]] = []  # (page, files made when it was asked for)

    def pages(folder: str):
        for page in range(3):
            asked.append((page, len(made)))
            for i in range(4):
                yield Entry(f"{folder}p{page}-{i}", 10, None)
        yield Entry(f"{folder}sub/", 0, None)  # a folder placeholder: no file

    def remote(path: str, entry: Entry) -> RemoteFile:
        made.append(path)
        return RemoteFile(path, entry.size, "v", locator=entry.key)

    listing = list_prefix(
        "data",
        where="s3://bucket/data",
        retry=RetryPolicy(attempts=1),
        list_folder=pages,
        lookup=lambda key: None,
        remote=remote,
    )
    assert asked == [(0, 0), (1, 4), (2, 8)]
    assert [f.path for f in listing.files] == made and len(made) == 12


def test_a_files_response_headers_are_dropped_once_its_checksum_is_known(tmp_path):
    """Every job lives until the run ends: with 100,000 S3 objects, their headers took the
    run's peak memory (PSS, both processes) from ~357 to ~695 MiB."""

    class OffersTheHeadersChecksum:
        def checksum_for(self, file: RemoteFile, headers: dict[str, str]) -> Checksum | None:
            return Checksum("s3-crc32", headers["x-amz-checksum-crc32"])

    source = OffersTheHeadersChecksum()
    job = FileJob(RemoteFile("a.bin", 10, "v"), tmp_path)
    job.note_headers({"x-amz-checksum-crc32": "AAAAAA=="})
    assert job.expected_checksum(source) == Checksum("s3-crc32", "AAAAAA==")  # type: ignore[arg-type]
    assert job.headers is None
    job.note_headers({"x-amz-checksum-crc32": "BBBBBB=="})  # another range's response
    assert job.headers is None
    assert job.expected_checksum(source) == Checksum("s3-crc32", "AAAAAA==")  # type: ignore[arg-type]


S3_NAMESPACE = "http://s3.amazonaws.com/doc/2006-03-01/"
LISTING = """<?xml version="1.0" encoding="UTF-8"?>
<ListBucketResult{xmlns}><Name>bucket</Name><Prefix>data/</Prefix><KeyCount>2</KeyCount>
<MaxKeys>1000</MaxKeys><EncodingType>url</EncodingType><IsTruncated>{truncated}</IsTruncated>{next}
<Contents><Key>data/{first}</Key><ETag>&quot;{md5}&quot;</ETag><Size>3</Size>
<ChecksumAlgorithm>CRC32</ChecksumAlgorithm><ChecksumType>FULL_OBJECT</ChecksumType></Contents>
<Contents><Key>data/{second}</Key><ETag>&quot;{md5}&quot;</ETag><Size>4</Size></Contents>
</ListBucketResult>"""


class _Listings(BaseHTTPRequestHandler):
    """ListObjectsV2 pages, in S3's namespace or in none (``namespaced`` on the server)."""

    def do_GET(self) -> None:
        query = parse_qs(urlsplit(self.path).query)
        second = "continuation-token" in query
        namespaced = self.server.namespaced  # type: ignore[attr-defined]
        body = LISTING.format(
            xmlns=f' xmlns="{S3_NAMESPACE}"' if namespaced else "",
            truncated="false" if second else "true",
            next="" if second else "<NextContinuationToken>page-2</NextContinuationToken>",
            first="d.txt" if second else "a.txt",
            second="e%2Bf.bin" if second else "b%20c.bin",  # encoding-type=url
            md5="0" * 32,
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize("namespaced", [True, False], ids=["in-s3-namespace", "in-none"])
def test_an_s3_listing_reads_the_same_in_s3s_namespace_or_in_none(namespaced, tmp_path):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Listings)
    server.namespaced = namespaced  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        settings = load_settings(
            AssetDefaults("dataset", tmp_path),
            ["--storage-uri", "s3://bucket/data", "--anonymous"],
            env={"ENDPOINT": f"http://127.0.0.1:{server.server_address[1]}"},
        )
        source = open_source(settings)
        listing = source.list()
        listing.complete()  # the second page is read on demand
    finally:
        server.shutdown()
    assert [(f.path, f.size, f.locator) for f in listing.files] == [
        ("a.txt", 3, "data/a.txt"),
        ("b c.bin", 4, "data/b c.bin"),
        ("d.txt", 3, "data/d.txt"),
        ("e+f.bin", 4, "data/e+f.bin"),
    ]
    assert all(f.checksum == Checksum("md5", "0" * 32) for f in listing.files)


SHARD_AND_TRACE = """
import json, sys, tracemalloc
from pathlib import Path
from initializers.filetable import FileTable
from initializers.manifest import FileRecord, write_manifest_records
from initializers import shards
from initializers.shards import ShardSpec, _complete, _merged, share
from initializers.sources.base import RemoteFile

shards.record_is_intact = lambda *_: True  # as if every file were on disk: no disk here

dest, count = Path(sys.argv[1]), int(sys.argv[2])
def remote(i):
    return RemoteFile(f"d/{i // 500:04d}/{i:07d}.jpg", 1000 + i % 7, f"e{i}")
records = [dest / f"shard-{i}.json" for i in range(3)]
for i, record in enumerate(records):  # each shard's record, as its engine writes it
    write_manifest_records(
        record, "s3://bucket/d", None,
        ((remote(n).path, FileRecord(remote(n).size, None, f"e{n}", 0))
         for n in range(i, count, 3)),
    )
tracemalloc.start()
listing = FileTable()
listing.extend(remote(i) for i in range(count))
mine, totals = share(listing, ShardSpec(3, 1))
complete = _complete(dest, listing, "s3://bucket/d", None)
merged, in_order, last = 0, True, ""
for path, _ in _merged(dest, records):
    merged, in_order, last = merged + 1, in_order and last < path, path
peak = tracemalloc.get_traced_memory()[1]
print(json.dumps({"peak": peak, "mine": len(mine), "bytes": sum(totals),
                  "merged": merged, "in_order": in_order, "complete": complete}))
"""


def test_a_shard_takes_its_share_and_merges_the_records_in_the_same_memory_for_more_files(
    tmp_path,
):
    """Every pod of a sharded fetch deals the whole listing, and the last one merges every
    shard's record into the manifest: both stream, so SHARDS holds at a million files."""

    small, large = (
        _traced(SHARD_AND_TRACE, tmp_path, 20_000),
        _traced(SHARD_AND_TRACE, tmp_path, 100_000),
    )
    assert small["mine"] in (6_666, 6_667) and large["mine"] in (33_333, 33_334)
    assert large["bytes"] == sum(1000 + i % 7 for i in range(100_000))
    assert (small["merged"], large["merged"]) == (20_000, 100_000)
    assert small["in_order"] and large["in_order"] and not large["complete"]
    assert large["peak"] < 2 * small["peak"], (small, large)


FETCH_AND_COLLECT = """
import collections, gc, json, os, sys
from pathlib import Path
import initializers.planning, initializers.processes
from initializers.dataset import main

out = Path(sys.argv[1])
initializers.planning.WINDOW = 50  # many windows, each to be freed as it ends
initializers.processes.MAX_PROCESSES = 1  # the windows run here, where they can be counted
exit_now = os._exit

def report(code):
    gc.set_debug(gc.DEBUG_SAVEALL)
    gc.collect()
    kinds = collections.Counter(type(thing).__name__ for thing in gc.garbage)
    print(json.dumps({"code": code, "copied": sum(1 for _ in out.rglob("*.txt")),
                      "jobs": kinds["FileJob"], "futures": kinds["Future"],
                      "cyclic": dict(kinds.most_common(5))}))
    sys.stdout.flush()
    exit_now(0)

os._exit = report
gc.disable()
main(["--output", str(out)])
"""


@pytest.mark.parametrize("scheme", ["file", "s3"])
def test_a_windows_jobs_and_futures_are_freed_when_it_ends_not_left_to_the_cycle_collector(
    scheme, bucket, tmp_path
):
    """A window's objects must go as it ends: left in reference cycles, they waited for a full
    collection, which a run of small files rarely triggers (the batch's futures called back into
    the batch). ``file://`` with a million one-byte files then peaked at 1,745 MiB."""
    names = [f"{i // 100:03d}/{i:05d}.txt" for i in range(600)]
    if scheme == "s3":
        for name in names:
            bucket.put(f"d/{name}", b"x")
        env = bucket.env("d/")
    else:
        for name in names:
            (tmp_path / "src" / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / "src" / name).write_bytes(b"x")
        env = {"STORAGE_URI": f"file://{tmp_path / 'src'}"}
    ran = subprocess.run(
        [sys.executable, "-c", FETCH_AND_COLLECT, str(tmp_path / "out")],
        env=clean_env(tmp_path, **env),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr
    got = json.loads(ran.stdout)
    assert (got["code"], got["copied"]) == (0, 600), (got, ran.stderr[-2000:])
    assert (got["jobs"], got["futures"]) == (0, 0), got

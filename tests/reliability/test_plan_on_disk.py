"""The plan on disk: a stop while a long listing arrives, a killed run's leftovers, and the
previous release's manifests.

The listing, the selection and the plan live in a scratch table under TMPDIR, and fetching
starts with the first page: a run stopped while the listing still arrives leaves no table and
only complete, recorded files; a killed run's table is removed by the next run, never one a
running run holds; and a destination the previous release completed (its manifest written by
that code) is complete for this one too.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from initializers.journal import CommitLog
from initializers.manifest import find_problems
from tests.conftest import clean_env

PAGE = 1000
PAGES = 200


class _SlowListing(BaseHTTPRequestHandler):
    """ListObjectsV2 of ``PAGES`` pages of ``PAGE`` one-byte keys, a tenth of a second a page;
    each key's object is ``x``."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        if urlsplit(self.path).path != "/bucket/":
            self.server.objects_served += 1  # type: ignore[attr-defined]
            self._send(b"x", "application/octet-stream")
            return
        query = {k: v[0] for k, v in parse_qs(urlsplit(self.path).query).items()}
        page = int(query.get("continuation-token", "0"))
        self.server.pages_served += 1  # type: ignore[attr-defined]
        time.sleep(0.1)
        more = page + 1 < PAGES
        keys = "".join(
            f"<Contents><Key>d/{page * PAGE + i:07d}.bin</Key><Size>1</Size>"
            f"<ETag>&quot;e{i}&quot;</ETag></Contents>"
            for i in range(PAGE)
        )
        body = (
            '<?xml version="1.0"?><ListBucketResult><Name>bucket</Name>'
            f"<IsTruncated>{'true' if more else 'false'}</IsTruncated>"
            + (f"<NextContinuationToken>{page + 1}</NextContinuationToken>" if more else "")
            + keys
            + "</ListBucketResult>"
        ).encode()
        self._send(body, "application/xml")

    def _send(self, body: bytes, kind: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the run was stopped
            self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_sigterm_while_a_long_listing_arrives_exits_143_leaving_no_scratch_and_only_whole_files(
    launch, tmp_path
):
    server = _serve_slow_listing()
    scratch, out = tmp_path / "tmp", tmp_path / "out"
    scratch.mkdir()
    try:
        live = launch(
            "dataset",
            env={
                "STORAGE_URI": "s3://bucket/d",
                "ENDPOINT": f"http://127.0.0.1:{server.server_address[1]}",
                "ANONYMOUS": "true",
                "REGION": "us-east-1",
                "OUTPUT_PATH": str(out),
                "TMPDIR": str(scratch),
            },
        )
        live.wait_for("listing s3://bucket/d")
        deadline = time.monotonic() + 30
        while (server.pages_served < 5 or not server.objects_served) and (  # type: ignore[attr-defined]
            time.monotonic() < deadline
        ):
            time.sleep(0.05)
        assert [p.name for p in scratch.iterdir()] != []  # the listing's table, filling
        live.proc.send_signal(signal.SIGTERM)
        assert live.proc.wait(timeout=10) == 143
    finally:
        server.shutdown()
    assert server.pages_served < PAGES  # type: ignore[attr-defined]
    assert list(scratch.iterdir()) == []
    # Fetching began with the first page: every file under its final name is whole, and
    # recorded in the commit log, so the rerun keeps it.
    final = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    final = {p for p in final if not p.rpartition("/")[2].startswith(".")}
    assert final, "nothing was fetched while the listing arrived"
    assert all((out / p).read_bytes() == b"x" for p in final)
    assert final <= {path for path, _ in CommitLog(out).records()}


def _serve_slow_listing() -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _SlowListing)
    server.pages_served = server.objects_served = 0  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _wait_unlocked(folder, timeout: float = 10) -> None:
    """Until no process holds ``folder``'s lock (a killed run's workers die a moment later)."""
    deadline = time.monotonic() + timeout
    fd = os.open(folder, os.O_RDONLY)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                assert time.monotonic() < deadline, f"{folder} still locked"
                time.sleep(0.05)
    finally:
        os.close(fd)


def test_a_killed_runs_scratch_folder_is_removed_by_the_next_run_and_a_running_ones_is_not(
    launch, tmp_path
):
    """A container restarted after an OOM kill keeps its /tmp emptyDir: what the killed run
    could not remove, the next one does, and never the folder of a run still going."""
    server = _serve_slow_listing()
    scratch, source = tmp_path / "tmp", tmp_path / "src"
    scratch.mkdir()
    source.mkdir()
    (source / "a.txt").write_bytes(b"alpha")
    listing_env = {
        "STORAGE_URI": "s3://bucket/d",
        "ENDPOINT": f"http://127.0.0.1:{server.server_address[1]}",
        "ANONYMOUS": "true",
        "REGION": "us-east-1",
        "TMPDIR": str(scratch),
    }
    try:
        killed = launch("dataset", env={**listing_env, "OUTPUT_PATH": str(tmp_path / "killed")})
        killed.wait_for("more than a page to list")
        killed.kill()
        (left,) = scratch.iterdir()
        _wait_unlocked(left)
        running = launch("dataset", env={**listing_env, "OUTPUT_PATH": str(tmp_path / "running")})
        running.wait_for("more than a page to list")
        (going,) = set(scratch.iterdir()) - {left}
        an_hour_ago = time.time() - 3600
        for folder in (left, going):  # both old enough to be judged by their lock alone
            os.utime(folder, (an_hour_ago, an_hour_ago))

        later = launch(
            "dataset",
            env={
                "STORAGE_URI": f"file://{source}",
                "OUTPUT_PATH": str(tmp_path / "later"),
                "TMPDIR": str(scratch),
            },
        )
        assert later.finish() == 0, later.stderr
        assert list(scratch.iterdir()) == [going]
        running.kill()
    finally:
        server.shutdown()


def _manifest_as_the_previous_release_wrote_it(source: str, records: dict[str, dict]) -> bytes:
    """The layout of d96e6ee's Manifest.json_pieces, spelled out independently of this code:
    the head, then a file's record per line in path order, then ``}}``."""
    head = json.dumps({"format": 1, "source": source, "revision": None})
    lines = [f"{json.dumps(path)}: {json.dumps(records[path])}" for path in sorted(records)]
    return (head[:-1] + ', "files": {\n' + ",\n".join(lines) + "\n}}\n").encode()


def test_a_destination_the_previous_release_completed_is_complete_for_this_one(tmp_path):
    """No refetch after an upgrade: a manifest in the previous release's layout is read, its
    records trusted as before, and the tree found complete."""
    source, out = tmp_path / "src", tmp_path / "out"
    (source / "sub").mkdir(parents=True)
    (source / "a.txt").write_bytes(b"alpha")
    (source / "sub" / "b.bin").write_bytes(b"\0" * 4096)
    env = clean_env(tmp_path, STORAGE_URI=f"file://{source}", OUTPUT_PATH=str(out))
    first = subprocess.run(
        [sys.executable, "-m", "initializers.dataset"], env=env, capture_output=True, text=True
    )
    assert first.returncode == 0, first.stderr
    written = json.loads((out / ".initializer-manifest.json").read_bytes())
    old = _manifest_as_the_previous_release_wrote_it(written["source"], written["files"])
    (out / ".initializer-manifest.json").write_bytes(old)
    mtimes = {p: os.stat(out / p).st_mtime_ns for p in ("a.txt", "sub/b.bin")}

    again = subprocess.run(
        [sys.executable, "-m", "initializers.dataset"], env=env, capture_output=True, text=True
    )
    assert again.returncode == 0, again.stderr
    assert "already complete (2 files" in again.stderr
    assert (out / ".initializer-manifest.json").read_bytes() == old  # not even rewritten
    assert {p: os.stat(out / p).st_mtime_ns for p in mtimes} == mtimes
    assert find_problems(out) == []


def test_the_manifest_keeps_the_previous_releases_layout_with_two_more_keys_in_its_head(
    tmp_path,
):
    """Tools that parse ours, and the previous release reading a tree this one completed, see
    the same layout: a file's record per line, byte for byte; the head adds which boot wrote
    the files and whether they were synced, keys the previous release's reader ignores."""
    source, out = tmp_path / "src", tmp_path / "out"
    source.mkdir()
    for name in ("z.json", "a b.txt", "ü.bin"):
        (source / name).write_bytes(name.encode())
    env = clean_env(tmp_path, STORAGE_URI=f"file://{source}", OUTPUT_PATH=str(out))
    ran = subprocess.run(
        [sys.executable, "-m", "initializers.dataset"], env=env, capture_output=True, text=True
    )
    assert ran.returncode == 0, ran.stderr
    head, records = (out / ".initializer-manifest.json").read_bytes().split(b"\n", 1)
    written = json.loads(head + records)
    old_head, old_records = _manifest_as_the_previous_release_wrote_it(
        written["source"], written["files"]
    ).split(b"\n", 1)
    assert records == old_records
    assert head.startswith(old_head[: -len(b', "files": {')])
    assert set(json.loads(head[: -len(b', "files": {')] + b"}")) == {
        "format", "source", "revision", "boot_id", "durable"
    }  # fmt: skip

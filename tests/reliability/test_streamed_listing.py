"""What fetching from the first listing page does differently, proved against a real HTTP server.

A listing of more than a page is planned page by page while the files of the first pages are
already being fetched. These specs pin what that must not change: a page that fails is asked
for again on its own; a listing that fails for good ends the run with what was fetched kept
for the rerun; a prefix that changes between pages gives a consistent tree; a disk found too
small after fetching began stops with exit 6 and nothing half-written under a final name;
a key that another key uses as a folder is still skipped, whichever page its folder is on.
"""

from __future__ import annotations

import bisect
import contextlib
import hashlib
import threading
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

import pytest

from initializers.journal import CommitLog
from initializers.manifest import find_problems

PER_PAGE = 5  # keys per listing page: hundreds of pages stay quick to serve


def body_of(key: str) -> bytes:
    return f"bytes of {key}\n".encode()


class Prefix:
    """A bucket's keys, a page of ``PER_PAGE`` at a time, and how the server misbehaves."""

    def __init__(self, keys: list[str]) -> None:
        self.keys = sorted(keys)
        self.sizes: dict[str, int] = {}  # a listed size other than the body's
        self.failures: dict[int, int] = {}  # page -> how many times it answers 503 first
        self.requests: Counter[int] = Counter()  # page -> listing requests
        self.gets: Counter[str] = Counter()  # key -> object GETs
        self.after_page: dict[int, list[str]] = {}  # page -> keys added once it was served
        self.overlap = False  # each page starts with the previous page's last key again

    def page(self, after: str) -> tuple[int, list[str], bool]:
        """The page after key ``after`` ("" for the first), as S3 pages: by key, so a key
        added meanwhile before the position is not listed and none is listed twice. Its
        number is the pages before it."""
        start = bisect.bisect_right(self.keys, after) if after else 0
        if self.overlap and start:
            start -= 1
        return (
            start // PER_PAGE,
            self.keys[start : start + PER_PAGE],
            start + PER_PAGE < len(self.keys),
        )


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out at once, not 40 ms apart
    server: _Server

    def do_GET(self) -> None:
        prefix = self.server.prefix
        parts = urlsplit(self.path)
        if parts.path != "/bucket/":
            key = unquote(parts.path.removeprefix("/bucket/"))
            prefix.gets[key] += 1
            self._send(200, body_of(key), "application/octet-stream")
            return
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        number, keys, more = prefix.page(query.get("continuation-token", ""))
        prefix.requests[number] += 1
        if prefix.failures.get(number, 0) > 0:
            prefix.failures[number] -= 1
            self._send(503, b"<Error><Code>SlowDown</Code></Error>", "application/xml")
            return
        body = _listing(prefix, keys, more)
        # Added before the page goes out: the next page's request must find them there.
        for key in prefix.after_page.pop(number, []):
            prefix.keys = sorted([*prefix.keys, key])
        self._send(200, body, "application/xml")

    def _send(self, status: int, body: bytes, kind: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def _listing(prefix: Prefix, keys: list[str], more: bool) -> bytes:
    contents = "".join(
        f"<Contents><Key>{key}</Key>"
        f"<Size>{prefix.sizes.get(key, len(body_of(key)))}</Size>"
        f"<ETag>&quot;{hashlib.md5(body_of(key)).hexdigest()}&quot;</ETag></Contents>"
        for key in keys
    )
    token = f"<NextContinuationToken>{keys[-1]}</NextContinuationToken>" if more else ""
    return (
        '<?xml version="1.0"?><ListBucketResult><Name>bucket</Name>'
        f"<IsTruncated>{'true' if more else 'false'}</IsTruncated>{token}{contents}"
        "</ListBucketResult>"
    ).encode()


class _Server(ThreadingHTTPServer):
    prefix: Prefix


@pytest.fixture
def serve() -> Iterator:
    servers: list[_Server] = []

    def start(prefix: Prefix) -> str:
        server = _Server(("127.0.0.1", 0), _Handler)
        server.prefix = prefix
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()


def _env(endpoint: str, out: Path, **extra: str) -> dict[str, str]:
    return {
        "STORAGE_URI": "s3://bucket/d",
        "ENDPOINT": endpoint,
        "ANONYMOUS": "true",
        "REGION": "us-east-1",
        "OUTPUT_PATH": str(out),
        "PROGRESS_INTERVAL": "60",
        **extra,
    }


def _keys(count: int) -> list[str]:
    return [f"d/{i // 100:03d}/{i:05d}.txt" for i in range(count)]


def _whole(out: Path, keys: list[str]) -> bool:
    return all((out / key.removeprefix("d/")).read_bytes() == body_of(key) for key in keys)


def test_a_page_that_fails_is_asked_for_again_alone_and_every_file_comes_once(
    serve, run_initializer, tmp_path
):
    prefix = Prefix(_keys(1500))  # 300 pages
    prefix.failures = {7: 1, 250: 2}
    out = tmp_path / "out"
    result = run_initializer("dataset", env=_env(serve(prefix), out))
    assert result.code == 0, result.output
    assert prefix.requests[7] == 2 and prefix.requests[250] == 3
    assert set(prefix.requests.values()) <= {1, 2, 3}
    assert sum(prefix.requests.values()) == 300 + 3
    assert set(prefix.gets.values()) == {1} and len(prefix.gets) == 1500
    assert _whole(out, prefix.keys) and find_problems(out) == []


def test_a_listing_that_fails_for_good_on_page_700_keeps_what_was_fetched_for_the_rerun(
    serve, run_initializer, tmp_path
):
    prefix = Prefix(_keys(3600))  # 720 pages
    prefix.failures = {700: 10**6}
    out = tmp_path / "out"
    endpoint = serve(prefix)
    failed = run_initializer("dataset", env=_env(endpoint, out, RETRIES="2"))
    assert failed.code == 7, failed.output
    assert "s3://bucket/d" in failed.stderr and "Traceback" not in failed.stderr
    assert not (out / ".initializer-manifest.json").exists()
    recorded = {f"d/{path}" for path, _ in CommitLog(out).records()}
    in_place = {key for key in recorded if (out / key.removeprefix("d/")).exists()}
    assert len(in_place) > 1000, "fetching did not start before the listing ended"
    assert _whole(out, sorted(in_place))
    before = prefix.gets.copy()

    prefix.failures = {}
    rerun = run_initializer("dataset", env=_env(endpoint, out))
    assert rerun.code == 0, rerun.output
    fetched_again = set(prefix.gets - before)
    assert fetched_again == set(prefix.keys) - in_place
    assert _whole(out, prefix.keys) and find_problems(out) == []


def test_keys_added_while_the_listing_runs_are_fetched_if_listed_and_by_the_rerun_if_not(
    serve, run_initializer, tmp_path
):
    prefix = Prefix(_keys(1500))
    behind, ahead = "d/000/00000-late.txt", "d/014/01499-late.txt"
    prefix.after_page = {100: [behind, ahead]}  # one before the position, one after
    out = tmp_path / "out"
    endpoint = serve(prefix)
    first = run_initializer("dataset", env=_env(endpoint, out))
    assert first.code == 0, first.output
    assert (out / ahead.removeprefix("d/")).exists()
    assert not (out / behind.removeprefix("d/")).exists()
    assert find_problems(out) == []  # complete as listed

    gets = sum(prefix.gets.values())
    rerun = run_initializer("dataset", env=_env(endpoint, out))
    assert rerun.code == 0, rerun.output
    assert sum(prefix.gets.values()) - gets == 1 and prefix.gets[behind] == 1
    assert _whole(out, prefix.keys) and find_problems(out) == []


def test_a_disk_found_too_small_after_fetching_began_stops_with_exit_6_and_nothing_half_written(
    serve, run_initializer, tmp_path
):
    keys = _keys(2000)
    prefix = Prefix(keys)
    prefix.sizes = {keys[1800]: 1 << 60}  # an exabyte, listed on page 361
    out = tmp_path / "out"
    result = run_initializer("dataset", env=_env(serve(prefix), out))
    assert result.code == 6, result.output
    assert "free space or use a bigger volume" in result.stderr
    assert "Traceback" not in result.stderr
    kept = {path for path, _ in CommitLog(out).records()}
    assert kept, "fetching did not start before the listing ended"
    final = {
        p.relative_to(out).as_posix()
        for p in out.rglob("*")
        if p.is_file() and not p.name.startswith(".")
    }
    assert final <= kept and _whole(out, [f"d/{path}" for path in final])
    assert not (out / ".initializer-manifest.json").exists()


def test_a_key_used_as_a_folder_on_a_later_page_is_skipped_as_when_listed_whole(
    serve, run_initializer, tmp_path
):
    keys = _keys(1500)
    # "d/007" sorts before "d/007/...": a file that is also a folder, whose files come on
    # the following pages; and "d/007-notes.txt", between them, is a file like any other.
    prefix = Prefix([*keys, "d/007", "d/007-notes.txt"])
    out = tmp_path / "out"
    result = run_initializer("dataset", env=_env(serve(prefix), out))
    assert result.code == 0, result.output
    assert "skipped '007': another key uses it as a folder" in result.stderr
    assert (out / "007").is_dir() and (out / "007-notes.txt").is_file()
    assert prefix.gets["d/007"] == 0
    assert _whole(out, [*keys, "d/007-notes.txt"]) and find_problems(out) == []


def test_pages_that_repeat_the_previous_pages_last_key_fetch_each_file_once(
    serve, run_initializer, tmp_path
):
    """A server whose pages overlap by a key (some S3-compatible stores, on a boundary): a key
    given twice is one file with one writer, not two jobs racing for one name."""
    prefix = Prefix(_keys(1500))
    prefix.overlap = True
    out = tmp_path / "out"
    result = run_initializer("dataset", env=_env(serve(prefix), out))
    assert result.code == 0, result.output
    assert "gave 374 key(s) twice in a row" in result.stderr  # 5 a page, 4 of them new
    assert set(prefix.gets.values()) == {1}, "every object fetched once"
    assert _whole(out, prefix.keys) and find_problems(out) == []

"""The latency option and the first-data-GET figure, against the real local nginx endpoints."""

from __future__ import annotations

import http.client
import os
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from benchmarks import accesslog, measure, verify
from benchmarks.endpoints import Endpoints
from benchmarks.fixtures import BUCKET, Fixture
from benchmarks.tests.hubrun import snapshot_download_dataset

DELAY = 0.020
OBJECT = f"/{BUCKET}/dataset/README.md"
LFS_FILE = "/bench/model/resolve/main/model-00001-of-00008.safetensors"
GIT_FILE = "/bench/model/resolve/main/config.json"


def _first_byte(url: str, method: str = "GET", path: str = "/") -> tuple[float, int, dict]:
    """Seconds from sending a request (on an open connection) to its status line and headers."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        conn.connect()
        start = time.perf_counter()
        conn.request(method, path)
        response = conn.getresponse()
        elapsed = time.perf_counter() - start
        response.read()
        return elapsed, response.status, dict(response.getheaders())
    finally:
        conn.close()


def _cdn_path(endpoints: Endpoints, delayed: bool) -> tuple[str, str]:
    """(CDN origin, path) the Hub redirects an LFS file to."""
    _s3, hub = endpoints.urls(delayed)
    _t, status, headers = _first_byte(hub, "GET", LFS_FILE)
    assert status == 302
    location = urlsplit(headers["Location"])
    return f"{location.scheme}://{location.netloc}", f"{location.path}?{location.query}"


REQUESTS = {
    "S3 object GET": ("s3", "GET", OBJECT, 200),
    "S3 object HEAD": ("s3", "HEAD", OBJECT, 200),
    "S3 listing": ("s3", "GET", f"/{BUCKET}?list-type=2&prefix=dataset/", 200),
    "Hub API": ("hub", "GET", "/api/models/bench/model", 200),
    "Hub resolve redirect": ("hub", "GET", LFS_FILE, 302),
    "Hub resolve of a git file": ("hub", "GET", GIT_FILE, 200),
    "CDN GET": ("cdn", "GET", "", 200),
}


@pytest.mark.parametrize("what", list(REQUESTS))
def test_the_latency_ports_hold_the_first_byte_of_every_response_at_least_20_ms(
    endpoints: Endpoints, what: str
) -> None:
    assert endpoints.latency_s == DELAY
    where, method, path, status = REQUESTS[what]
    waits = {}
    for delayed in (False, True):
        if where == "cdn":
            origin, path = _cdn_path(endpoints, delayed)
        else:
            origin = endpoints.urls(delayed)[0 if where == "s3" else 1]
        samples = []
        for _ in range(3):
            elapsed, got, _headers = _first_byte(origin, method, path)
            assert got == status
            samples.append(elapsed)
        waits[delayed] = samples
    assert min(waits[True]) >= DELAY, waits
    assert min(waits[False]) < min(waits[True]), waits


def test_the_delayed_hub_redirects_to_the_delayed_cdn(endpoints: Endpoints) -> None:
    plain, _ = _cdn_path(endpoints, delayed=False)
    delayed, _ = _cdn_path(endpoints, delayed=True)
    assert plain == endpoints.cdn_url
    assert delayed == endpoints.latency_cdn_url != plain


def test_snapshot_download_through_the_delayed_hub_gets_every_byte_counted(
    fixture: Fixture, endpoints: Endpoints, tmp_path: Path
) -> None:
    argv, env = snapshot_download_dataset(endpoints.latency_hub_url, tmp_path)
    position = endpoints.log_position()
    m = measure.run(argv, env, tmp_path / "log")
    assert m.returncode == 0, m.log_tail
    assert verify.check(tmp_path / "d", fixture, "dataset") == []
    time.sleep(0.05)
    traffic = endpoints.traffic_since(position)["hub"]
    assert traffic.data_bytes == fixture.expected_bytes("dataset")
    delayed_ports = {p.number for p in endpoints.ports.values() if p.delayed}
    entries = accesslog.read_since(endpoints.access_log, position)
    assert entries and all(e.port in delayed_ports for e in entries)
    assert all(e.duration >= DELAY - 0.001 for e in entries)  # every response waited


def test_a_log_line_gives_the_request_arrival_as_its_end_minus_its_duration() -> None:
    entry = accesslog.parse_line("1764582000.250 0.125 8080 GET /bench/dataset/a.bin?x=1 200 42")
    assert entry is not None
    assert entry.arrived == pytest.approx(1764582000.125)
    assert (entry.port, entry.path, entry.body_bytes) == (8080, "/bench/dataset/a.bin", 42)
    assert accesslog.parse_line("1764582000.250 8080 GET / 200 42") is None  # old format
    assert accesslog.parse_line("") is None


@pytest.mark.parametrize(
    ("role", "method", "uri", "data"),
    [
        ("s3", "GET", "/bench/dataset/data/train/x.parquet", True),
        ("s3", "GET", "/bench/model/a.bin?X-Amz-Signature=abc", True),
        ("s3", "HEAD", "/bench/model/a.bin", False),
        ("s3", "GET", "/bench?list-type=2&prefix=model/", False),
        ("s3", "GET", "/bench/", False),
        ("hub", "GET", "/bench/model/resolve/main/config.json", True),
        ("hub", "GET", "/api/models/bench/model/tree/main?recursive=true", False),
        ("hub", "HEAD", "/bench/model/resolve/main/config.json", False),
        ("cdn", "GET", "/lfs/" + "a" * 64, True),
    ],
)
def test_only_file_data_gets_count_as_data(role: str, method: str, uri: str, data: bool) -> None:
    entry = accesslog.parse_line(f"1.0 0.0 1 {method} {uri} 200 0")
    assert entry is not None
    assert accesslog.is_data_get(entry, role) is data


@pytest.mark.parametrize("delayed", [False, True])
def test_the_first_data_get_is_timed_from_the_spawn_to_its_arrival_at_nginx(
    endpoints: Endpoints, tmp_path: Path, delayed: bool
) -> None:
    # A client that lists first (not data), sleeps 0.3 s, then GETs an object.
    s3_url, _hub = endpoints.urls(delayed)
    client = (
        "import time, urllib.request as u\n"
        f"u.urlopen({s3_url!r} + '/{BUCKET}?list-type=2&prefix=dataset/').read()\n"
        "time.sleep(0.3)\n"
        f"u.urlopen({s3_url!r} + {OBJECT!r}).read()\n"
    )
    position = endpoints.log_position()
    m = measure.run([sys.executable, "-c", client], dict(os.environ), tmp_path / "log")
    assert m.returncode == 0, m.log_tail
    time.sleep(0.05)
    traffic = endpoints.traffic_since(position)["s3"]
    assert traffic.requests == 2 and traffic.first_data_get is not None
    first_get = traffic.first_data_get - m.started_at
    # Interpreter start + the listing (delayed or not) + 0.3 s; the GET's own wait is not in it.
    floor = 0.3 + (DELAY if delayed else 0)
    assert floor <= first_get < m.wall_s


def test_a_run_without_data_gets_has_no_first_data_get(endpoints: Endpoints) -> None:
    position = endpoints.log_position()
    _first_byte(endpoints.s3_url, "HEAD", OBJECT)
    time.sleep(0.05)
    assert endpoints.traffic_since(position)["s3"].first_data_get is None

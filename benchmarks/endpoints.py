"""Start the benchmark's S3 and Hub endpoints behind one nginx, and count what they served.

One nginx, three ports: the S3 port serves objects from disk and sends listings to
:mod:`benchmarks.s3api`; the Hub port proxies the API and ``resolve`` to the project's test Hub
(:mod:`benchmarks.hubendpoint`); the CDN port serves from disk the LFS files the Hub redirects to
(another origin, as huggingface_hub expects). Every request
on either port lands in one access log, so the bytes a client pulled in a run are counted the
same way for every contender.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.fixtures import Fixture
from benchmarks.hubendpoint import nginx_cdn_location
from benchmarks.nginx import Nginx, free_port
from benchmarks.s3endpoint import s3_http_body, start_s3api

REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Traffic:
    """What an endpoint served between two points of the access log.

    ``data_bytes`` counts file bodies only (S3 object GETs, Hub ``resolve`` and CDN GETs), not
    listings or API answers.
    """

    requests: int = 0
    bytes: int = 0
    data_bytes: int = 0


class Endpoints:
    """S3 at ``s3_url`` and a Hub at ``hub_url`` over ``fixture``; use as a context manager."""

    def __init__(self, fixture: Fixture, run_dir: Path) -> None:
        self.fixture = fixture
        self.run_dir = run_dir.resolve()
        self.s3_port, self.s3api_port = free_port(), free_port()
        self.hub_port, self.cdn_port = free_port(), free_port()
        self.s3_url = f"http://127.0.0.1:{self.s3_port}"
        self.hub_url = f"http://127.0.0.1:{self.hub_port}"
        # The Hub's CDN is another origin (port), as huggingface_hub expects of a real Hub.
        self.cdn_url = f"http://127.0.0.1:{self.cdn_port}"
        self.hub_api_url = ""  # the Python Hub listener itself, behind nginx
        self._procs: list[subprocess.Popen] = []
        self.nginx: Nginx | None = None

    def __enter__(self) -> Endpoints:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        for stale in ("access.log", "error.log"):
            (self.run_dir / stale).unlink(missing_ok=True)
        self._procs.append(start_s3api(self.fixture, self.s3api_port))
        lfs_dir = self.fixture.root / "hub-lfs"
        self.hub_api_url = self._start_hub(lfs_dir)
        body = s3_http_body(self.fixture, self.run_dir, self.s3_port, self.s3api_port)
        hub_upstream = self.hub_api_url.removeprefix("http://")
        body += f"""
    upstream hubpy {{ server {hub_upstream}; keepalive 32; }}
    server {{
        listen 127.0.0.1:{self.cdn_port} backlog=4096;
        {nginx_cdn_location(lfs_dir)}
    }}
    server {{
        listen 127.0.0.1:{self.hub_port} backlog=4096;
        location / {{
            proxy_pass http://hubpy;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $http_host;
            proxy_buffering off;
            proxy_request_buffering off;
        }}
    }}
"""
        self.nginx = Nginx(self.run_dir, body)
        self.nginx.start([self.s3_port, self.hub_port, self.cdn_port])

    def _start_hub(self, lfs_dir: Path) -> str:
        ready = self.run_dir / "hub-ready.json"
        ready.unlink(missing_ok=True)
        argv = [
            sys.executable, "-m", "benchmarks.hubendpoint",
            "--fixture", str(self.fixture.root),
            "--cdn-url", self.cdn_url,
            "--lfs-dir", str(lfs_dir),
            "--ready", str(ready),
        ]  # fmt: skip
        proc = subprocess.Popen(
            argv,
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
        )
        self._procs.append(proc)
        deadline = time.monotonic() + 300  # hashing a few GiB of LFS files takes a while
        while not ready.exists():
            if proc.poll() is not None:
                raise RuntimeError(f"the Hub endpoint exited with {proc.returncode}")
            if time.monotonic() > deadline:
                raise RuntimeError("the Hub endpoint did not come up in 300 s")
            time.sleep(0.1)
        return json.loads(ready.read_text())["endpoint"]

    def stop(self) -> None:
        if self.nginx:
            self.nginx.stop()
        for proc in self._procs:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self._procs.clear()

    # -- accounting ------------------------------------------------------------------------
    def log_position(self) -> int:
        log = self.run_dir / "access.log"
        return log.stat().st_size if log.exists() else 0

    def traffic_since(self, position: int) -> dict[str, Traffic]:
        """Requests and body bytes per endpoint ("s3", "hub") logged after ``position``."""
        out = {"s3": Traffic(), "hub": Traffic()}
        s3, hub, cdn = str(self.s3_port), str(self.hub_port), str(self.cdn_port)
        with open(self.run_dir / "access.log", "rb") as f:
            f.seek(position)
            for line in f.read().decode(errors="replace").splitlines():
                fields = line.split()  # msec port method uri status bytes
                if len(fields) < 6 or fields[1] not in (s3, hub, cdn):
                    continue
                t = out["s3" if fields[1] == s3 else "hub"]
                t.requests += 1
                t.bytes += int(fields[5])
                path = fields[3].split("?", 1)[0]
                if fields[2] == "GET" and (
                    fields[1] == cdn
                    or (fields[1] == hub and "/resolve/" in path)
                    or (fields[1] == s3 and path.count("/") >= 2 and not path.endswith("/"))
                ):
                    t.data_bytes += int(fields[5])
        return out

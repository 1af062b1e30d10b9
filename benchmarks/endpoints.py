"""Start the benchmark's S3 and Hub endpoints behind one nginx, and count what they served.

One nginx, three ports: the S3 port serves objects from disk and sends listings to
:mod:`benchmarks.s3api`; the Hub port proxies the API and ``resolve`` to the project's test Hub
(:mod:`benchmarks.hubendpoint`); the CDN port serves from disk the LFS files the Hub redirects to
(another origin, as huggingface_hub expects). The same three again on other ports with the
latency option (:mod:`benchmarks.latency`): every response waits ``latency_s`` before its first
byte, and the delayed Hub's redirects point at the delayed CDN. One more S3 port serves the same
bucket with nginx's own ETags and no checksums (``nginx_s3_url``,
:func:`benchmarks.s3endpoint.s3_server`), and another over HTTPS (``tls_s3_url``), with a
certificate from a CA the benchmark makes for the session (``ca_bundle``). Every request on any
port lands in one access log (:mod:`benchmarks.accesslog`), so the bytes a client pulled in a
run, and when its first data GET arrived, are counted the same way for every contender.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks import accesslog, latency
from benchmarks.fixtures import Fixture
from benchmarks.hubendpoint import nginx_cdn_location
from benchmarks.nginx import HeldPorts, Nginx, free_port
from benchmarks.s3endpoint import s3_http_shared, s3_server, start_s3api

REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Traffic:
    """What an endpoint served between two points of the access log.

    ``data_bytes`` counts file bodies only (S3 object GETs, Hub ``resolve`` and CDN GETs), not
    listings or API answers; ``first_data_get`` is when the first of those GETs arrived (epoch
    seconds), None when there was none.
    """

    requests: int = 0
    bytes: int = 0
    data_bytes: int = 0
    first_data_get: float | None = None


@dataclass(frozen=True)
class Port:
    """One nginx port: which endpoint it belongs to ("s3" or "hub"), its role, its delay, and
    for S3 whether it answers with nginx's own ETags and no checksums, or over HTTPS."""

    number: int
    endpoint: str
    role: str  # accesslog.ROLES
    delayed: bool
    nginx_etags: bool = False
    tls: bool = False

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.number}"

    @property
    def plain(self) -> bool:
        """The port of its role that every scenario but the nginx-style and HTTPS ones uses."""
        return not (self.nginx_etags or self.tls)


class Endpoints:
    """S3 at ``s3_url`` and a Hub at ``hub_url`` over ``fixture``; use as a context manager.

    With ``latency_s`` > 0 (the default) the same endpoints also answer, delayed, at
    ``latency_s3_url`` and ``latency_hub_url`` (whose CDN is ``latency_cdn_url``).
    """

    def __init__(
        self, fixture: Fixture, run_dir: Path, latency_s: float = latency.DEFAULT_DELAY_S
    ) -> None:
        self.fixture = fixture
        self.run_dir = run_dir.resolve()
        self.latency_s = latency_s
        self.s3api_port = free_port()  # bound by its server before the Hub's binds its own
        # nginx's, held until it starts: the Hub's listeners, started first, bind port 0.
        self._nginx_ports = HeldPorts()
        layout = (("s3", "s3"), ("hub", "hub"), ("hub", "cdn"))
        delays = (False, True) if latency_s > 0 else (False,)
        self.ports: dict[int, Port] = {}
        for delayed in delays:
            for endpoint, role in layout:
                port = Port(self._nginx_ports.take(), endpoint, role, delayed)
                self.ports[port.number] = port
        nginx_style = Port(self._nginx_ports.take(), "s3", "s3", delayed=False, nginx_etags=True)
        self.ports[nginx_style.number] = nginx_style
        self.nginx_s3_url = nginx_style.url
        tls = Port(self._nginx_ports.take(), "s3", "s3", delayed=False, tls=True)
        self.ports[tls.number] = tls
        self.tls_s3_url = tls.url
        self.ca_bundle = self.run_dir / "tls" / "ca.pem"  # made by start()
        self.s3_port = self._port("s3").number
        self.hub_port = self._port("hub").number
        # The Hub's CDN is another origin (port), as huggingface_hub expects of a real Hub.
        self.cdn_port = self._port("cdn").number
        self.s3_url, self.hub_url = self.urls(delayed=False)
        self.cdn_url = self._port("cdn").url
        self.latency_s3_url = self.latency_hub_url = self.latency_cdn_url = ""
        if latency_s > 0:
            self.latency_s3_url, self.latency_hub_url = self.urls(delayed=True)
            self.latency_cdn_url = self._port("cdn", delayed=True).url
        self.hub_api_url = ""  # the Python Hub listener itself, behind nginx
        self._procs: list[subprocess.Popen] = []
        self._s3api: subprocess.Popen | None = None
        self.nginx: Nginx | None = None

    def _port(self, role: str, delayed: bool = False) -> Port:
        return next(
            p for p in self.ports.values() if p.role == role and p.delayed == delayed and p.plain
        )

    def urls(self, delayed: bool) -> tuple[str, str]:
        """(S3 URL, Hub URL) of the plain or the delayed endpoints."""
        if delayed and self.latency_s <= 0:
            raise ValueError("these endpoints were started without the latency option")
        return self._port("s3", delayed).url, self._port("hub", delayed).url

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
        modules = latency.MODULES if self.latency_s > 0 else ()
        missing = latency.missing_modules() if modules else []
        if missing:
            raise RuntimeError(
                f"the latency option needs nginx's Lua module ({', '.join(map(str, missing))} "
                "missing): run benchmarks/setup.sh"
            )
        self.run_dir.mkdir(parents=True, exist_ok=True)
        for stale in ("access.log", "error.log"):
            (self.run_dir / stale).unlink(missing_ok=True)
        self._s3api = start_s3api(self.fixture, self.s3api_port)
        self._procs.append(self._s3api)
        lfs_dir = self.fixture.root / "hub-lfs"
        self.hub_api_url = self._start_hub(lfs_dir)
        tls = self._make_certificate()
        body = s3_http_shared(self.fixture, self.run_dir, self.s3api_port)
        body += f"""
    upstream hubpy {{ server {self.hub_api_url.removeprefix("http://")}; keepalive 32; }}
"""
        for port in self.ports.values():
            delay = latency.first_byte_delay(self.latency_s) if port.delayed else ""
            if port.role == "s3":
                body += s3_server(
                    self.fixture, port.number, delay, port.nginx_etags, tls if port.tls else None
                )
            elif port.role == "cdn":
                body += _cdn_server(port.number, lfs_dir, delay)
            else:
                # The Hub's redirects name the plain CDN; the delayed Hub's name the delayed one.
                cdn = self._port("cdn", port.delayed).url
                body += _hub_server(port.number, delay, redirect=(self.cdn_url, cdn))
        self.nginx = Nginx(self.run_dir, body, modules=modules)
        self._nginx_ports.release()
        self.nginx.start(list(self.ports))

    def _make_certificate(self) -> tuple[Path, Path]:
        """A CA of this session's (``ca_bundle``, which the contenders are told to trust) and the
        HTTPS port's certificate for 127.0.0.1, signed by it: (certificate, key)."""
        from tests.servers.tls import ca_signed

        folder = self.ca_bundle.parent
        folder.mkdir(parents=True, exist_ok=True)
        certificate, key = folder / "server.pem", folder / "server.key"
        ca_signed(self.ca_bundle, certificate, key)
        return certificate, key

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
        self._nginx_ports.release()
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
    def s3_server_pids(self) -> list[int]:
        """The processes serving S3: nginx's master and workers, and the S3 API layer (its
        listings). Their CPU is part of what a fetch costs the machine."""
        import psutil

        pids = []
        if self.nginx and self.nginx.proc:
            pids.append(self.nginx.proc.pid)
            with contextlib.suppress(psutil.Error):
                pids += [c.pid for c in psutil.Process(self.nginx.proc.pid).children()]
        if self._s3api is not None:
            pids.append(self._s3api.pid)
        return pids

    @property
    def access_log(self) -> Path:
        return self.run_dir / "access.log"

    def log_position(self) -> int:
        log = self.access_log
        return log.stat().st_size if log.exists() else 0

    def traffic_since(self, position: int) -> dict[str, Traffic]:
        """Requests, body bytes and the first data GET per endpoint ("s3", "hub") after
        ``position`` of the access log, plain and delayed ports together."""
        out = {"s3": Traffic(), "hub": Traffic()}
        for entry in accesslog.read_since(self.access_log, position):
            port = self.ports.get(entry.port)
            if port is None:
                continue
            t = out[port.endpoint]
            t.requests += 1
            t.bytes += entry.body_bytes
            if accesslog.is_data_get(entry, port.role):
                t.data_bytes += entry.body_bytes
                if t.first_data_get is None or entry.arrived < t.first_data_get:
                    t.first_data_get = entry.arrived
        return out


def _cdn_server(port: int, lfs_dir: Path, extra: str) -> str:
    return f"""
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        {extra}
        {nginx_cdn_location(lfs_dir)}
    }}
"""


def _hub_server(port: int, extra: str, redirect: tuple[str, str]) -> str:
    plain, served = redirect
    rewrite = f"proxy_redirect {plain}/ {served}/;" if served != plain else ""
    return f"""
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        {extra}
        location / {{
            proxy_pass http://hubpy;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $http_host;
            proxy_buffering off;
            proxy_request_buffering off;
            {rewrite}
        }}
    }}
"""

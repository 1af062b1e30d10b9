"""Run a private nginx in the foreground from a generated config (no system service touched)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from benchmarks.accesslog import LOG_FORMAT

# Debian's libnginx-mod-http-headers-more-filter: lets a location drop a request header.
HEADERS_MORE = "/usr/lib/nginx/modules/ngx_http_headers_more_filter_module.so"
# open_file_cache keeps a descriptor per cached file: it must stay below worker_rlimit_nofile
# less worker_connections (a 100,000-file fixture ran nginx out of descriptors at max=20000).
# 4096 holds every file of the standard fixtures (~2,000).
HTTP_COMMON = """
    default_type application/octet-stream;
    types {{ }}
    sendfile on;
    tcp_nopush on;
    tcp_nodelay on;
    keepalive_timeout 300s;
    keepalive_requests 1000000;
    open_file_cache max=4096 inactive=300s;
    client_body_temp_path {run}/tmp/body;
    proxy_temp_path {run}/tmp/proxy;
    fastcgi_temp_path {run}/tmp/fastcgi;
    uwsgi_temp_path {run}/tmp/uwsgi;
    scgi_temp_path {run}/tmp/scgi;
    log_format bench '{log_format}';
    access_log {run}/access.log bench;
    map_hash_max_size 262144;
    map_hash_bucket_size 256;
"""


def free_port() -> int:
    """A port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class HeldPorts:
    """Ports on 127.0.0.1 kept bound (not listening, no ``SO_REUSEADDR``) until :meth:`release`,
    so that no server started meanwhile takes one when it binds port 0: a port picked and let go
    at once was, once, the Hub listener's by the time nginx came to bind it."""

    def __init__(self) -> None:
        self._held: list[socket.socket] = []

    def take(self) -> int:
        held = socket.socket()
        held.bind(("127.0.0.1", 0))
        self._held.append(held)
        return held.getsockname()[1]

    def release(self) -> None:
        """Let every port go: just before the server meant to listen on them binds them."""
        for held in self._held:
            held.close()
        self._held.clear()


def wait_for_port(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"nothing listens on 127.0.0.1:{port} after {timeout}s"
                ) from None
            time.sleep(0.05)


class Nginx:
    """nginx with ``http_body`` (maps, upstreams, servers) inside a generated ``http {}``.

    ``modules``: dynamic modules to load besides headers-more, in order.
    """

    def __init__(
        self, run_dir: Path, http_body: str, workers: int = 2, modules: Sequence[Path] = ()
    ) -> None:
        self.run_dir = run_dir
        self.http_body = http_body
        self.workers = workers
        self.modules = tuple(modules)
        self.proc: subprocess.Popen | None = None

    @property
    def access_log(self) -> Path:
        return self.run_dir / "access.log"

    def config(self) -> str:
        run = self.run_dir
        return (
            "".join(f"load_module {m};\n" for m in (HEADERS_MORE, *self.modules))
            # Workers would drop to "nobody" and could not read fixtures in private folders.
            + ("user root;\n" if os.geteuid() == 0 else "")
            + f"worker_processes {self.workers};\ndaemon off;\npid {run}/nginx.pid;\n"
            f"error_log {run}/error.log warn;\nworker_rlimit_nofile 16384;\n"
            "events { worker_connections 8192; multi_accept on; }\n"
            "http {\n"
            + HTTP_COMMON.format(run=run, log_format=LOG_FORMAT)
            + self.http_body
            + "\n}\n"
        )

    def start(self, ports: list[int]) -> None:
        binary = shutil.which("nginx") or "/usr/sbin/nginx"
        (self.run_dir / "tmp").mkdir(parents=True, exist_ok=True)
        conf = self.run_dir / "nginx.conf"
        conf.write_text(self.config())
        args = [binary, "-p", str(self.run_dir), "-e", str(self.run_dir / "error.log"), "-c"]
        check = subprocess.run([*args, str(conf), "-t"], capture_output=True, text=True)
        if check.returncode:
            raise RuntimeError(f"nginx rejected {conf}: {check.stderr.strip()}")
        self.proc = subprocess.Popen([*args, str(conf)], stdin=subprocess.DEVNULL)
        for port in ports:
            wait_for_port(port)
        if self.proc.poll() is not None:  # another process answered on a port it could not bind
            raise RuntimeError(f"nginx exited at its start; see {self.run_dir / 'error.log'}")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM: fast shutdown of master and workers
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

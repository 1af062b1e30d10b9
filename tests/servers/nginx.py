"""A private nginx on 127.0.0.1 serving a temp folder: a real third-party server for http(s)://.

Everything it writes (config, pid, logs, temp folders) lives under its own run folder; no root
is needed, and under root its workers stay root so they can read pytest's private temp folders.
Static files are served as nginx does by default: ranges, a strong ETag (``"<mtime>-<size>"``
in hex: gzip stays off, which would weaken it), ``If-Match`` answered with 412. Files under
``/slow/`` are sent at 16 MiB/s per connection, so a test can act while a range is in flight.

``put`` replaces a file atomically (as a deploy would: a request in flight keeps the old bytes)
and gives every version its own mtime, hence its own ETag. ``requests()`` parses the access
log: one :class:`Request` per request nginx has finished.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from itertools import count
from pathlib import Path

from tests.servers.ports import free_port, wait_for_port

SLOW_RATE = "16m"
_FIELDS = (
    "$request_method",
    "$uri",
    "$status",
    "$body_bytes_sent",
    "$http_range",
    "$http_if_match",
)
_LOG_FORMAT = "\t".join(_FIELDS)  # a raw tab: nginx reads no escapes in the format
_MTIMES = count(1_700_000_000, 60)  # a distinct mtime for every version put, in any instance


def binary() -> str | None:
    """The nginx executable, or None when nginx is not installed."""
    found = shutil.which("nginx")
    if found:
        return found
    return "/usr/sbin/nginx" if os.access("/usr/sbin/nginx", os.X_OK) else None


@dataclass(frozen=True)
class Request:
    """One line of the access log (``range`` and ``if_match`` are None when not sent)."""

    method: str
    path: str
    status: int
    body_bytes: int
    range: str | None
    if_match: str | None


class Nginx:
    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.root = run_dir / "www"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.access_log = run_dir / "access.log"
        self._proc: subprocess.Popen[bytes] | None = None

    def config(self) -> str:
        run = self.run_dir
        temp = "".join(
            f"    {kind}_temp_path {run}/tmp/{kind};\n"
            for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
        )
        return (
            ("user root;\n" if os.geteuid() == 0 else "")
            + f"daemon off;\nworker_processes 1;\npid {run}/nginx.pid;\n"
            f"error_log {run}/error.log warn;\n"
            "events { worker_connections 256; }\n"
            "http {\n"
            "    default_type application/octet-stream;\n"
            "    types { }\n"
            "    sendfile on;\n"
            "    gzip off;\n"
            f"{temp}"
            f"    log_format specs escape=none '{_LOG_FORMAT}';\n"
            f"    access_log {self.access_log} specs;\n"
            "    server {\n"
            f"        listen 127.0.0.1:{self.port};\n"
            f"        root {self.root};\n"
            f"        location /slow/ {{ limit_rate {SLOW_RATE}; }}\n"
            "    }\n"
            "}\n"
        )

    def start(self) -> Nginx:
        executable = binary()
        if executable is None:
            raise RuntimeError("nginx is not installed")
        (self.run_dir / "tmp").mkdir(parents=True, exist_ok=True)
        self.root.mkdir(parents=True, exist_ok=True)
        conf = self.run_dir / "nginx.conf"
        conf.write_text(self.config())
        args = [executable, "-p", str(self.run_dir), "-e", str(self.run_dir / "error.log")]
        check = subprocess.run([*args, "-t", "-c", str(conf)], capture_output=True, text=True)
        if check.returncode:
            raise RuntimeError(f"nginx rejected {conf}: {check.stderr.strip()}")
        self._proc = subprocess.Popen(
            [*args, "-c", str(conf)], stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            wait_for_port(self.port, 10, "nginx")
        except RuntimeError:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()  # SIGTERM: fast shutdown of the master and its worker
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()

    def put(self, path: str, body: bytes) -> str:
        """Serve ``body`` at URL ``path`` (replacing any earlier version); its URL."""
        target = self.root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        staged = target.with_name(f".{target.name}.new")
        staged.write_bytes(body)
        mtime = next(_MTIMES)
        os.utime(staged, (mtime, mtime))
        staged.replace(target)
        return self.url + path

    def etag(self, path: str) -> str:
        """The ETag nginx sends for ``path`` now (asked with a HEAD)."""
        request = urllib.request.Request(self.url + path, method="HEAD")
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.headers["ETag"]

    def requests(self, path: str | None = None) -> list[Request]:
        """Every request nginx has logged (of ``path`` only, when given), oldest first.

        nginx logs a request once it is done with it, which can be a moment after the client
        has its last byte: this waits until the log stops growing for 0.2 s.
        """
        size, still = -1, time.monotonic()
        while True:
            now = self.access_log.stat().st_size if self.access_log.exists() else 0
            if now != size:
                size, still = now, time.monotonic()
            elif time.monotonic() - still >= 0.2:
                break
            time.sleep(0.05)
        lines = self.access_log.read_text().splitlines() if size else []
        found = [_parse(line) for line in lines]
        return [r for r in found if path is None or r.path == path]


def _parse(line: str) -> Request:
    method, path, status, sent, ranged, if_match = line.split("\t")
    return Request(
        method,
        path,
        int(status),
        int(sent),
        ranged or None,  # escape=none logs a header not sent as an empty field
        if_match or None,
    )

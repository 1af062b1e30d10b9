"""Make a virtual environment with pip in it, then ``pip install`` into it (make's first step).

    python3 scripts/mkvenv.py DIR [PIP INSTALL ARGS...]      e.g. .venv -q -e '.[test]'

Standard library only, so it runs on a distribution's python3 (PEP 668 "externally managed":
pip refuses to install into it, so everything goes into DIR). Stock Debian 12 and Ubuntu 24.04
often lack ``python3-venv`` (ensurepip) and ``python3-pip``; ``venv --without-pip`` works
there, and pip comes from the first of these that works:

1. ensurepip (python3-venv installed; offline),
2. the interpreter's own pip (``python3 -m pip --python DIR/bin/python install pip``),
3. the newest pip wheel for this Python from the package index (``PIP_INDEX_URL``, else
   PyPI), fetched with urllib, checked against the index's sha256 and installed by itself.

A DIR whose python or pip no longer runs is remade; a working one is reused. A lock on DIR
serialises concurrent runs (two ``make test`` in one checkout).
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import html.parser
import os
import re
import ssl
import subprocess
import sys
import tempfile
import urllib.parse
import urllib.request
import venv
from pathlib import Path

FIX = "on Debian/Ubuntu: sudo apt install python3-venv"


def log(message: str) -> None:
    print(f"venv: {message}", file=sys.stderr, flush=True)


def runs(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, check=False)


def pip_works(python: Path) -> bool:
    return python.exists() and runs(str(python), "-m", "pip", "--version").returncode == 0


class Links(html.parser.HTMLParser):
    """The ``<a>`` elements of a PEP 503 simple-index page: (href, attributes)."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a" and (found := dict(attrs)).get("href"):
            self.links.append((found["href"] or "", found))


def fetch(url: str) -> bytes:
    """GET with the index's credentials (user:password@ in the URL) and PIP_CERT if set."""
    parts = urllib.parse.urlsplit(url)
    headers = {"User-Agent": "kf-initializers-venv"}
    if parts.username is not None:
        user, password = (urllib.parse.unquote(x or "") for x in (parts.username, parts.password))
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        headers["Authorization"] = f"Basic {token}"
        parts = parts._replace(netloc=parts.netloc.rpartition("@")[2])
    context = ssl.create_default_context(cafile=os.environ.get("PIP_CERT") or None)
    request = urllib.request.Request(urllib.parse.urlunsplit(parts), headers=headers)
    with urllib.request.urlopen(request, timeout=60, context=context) as response:
        return response.read()


def newest_pip_wheel(index: str) -> tuple[str, str, str | None]:
    """(url, file name, sha256 or None) of the newest pip wheel this Python may run."""
    page = index.rstrip("/") + "/pip/"
    parser = Links()
    parser.feed(fetch(page).decode("utf-8", "replace"))
    best: tuple[tuple[int, ...], str, str, str | None] | None = None
    for href, attrs in parser.links:
        url, _, fragment = urllib.parse.urljoin(page, href).partition("#")
        name = urllib.parse.unquote(url.rsplit("/", 1)[-1])
        match = re.fullmatch(r"pip-(\d+(?:\.\d+)*)-py3-none-any\.whl", name)
        if not match or "data-yanked" in attrs:
            continue
        # Only lower bounds can exclude the newest pip from a current Python.
        floors = re.findall(r">=\s*(\d+(?:\.\d+)*)", attrs.get("data-requires-python") or "")
        if any(sys.version_info[:3] < tuple(map(int, f.split("."))) for f in floors):
            continue
        version = tuple(map(int, match[1].split(".")))
        sha256 = fragment[7:] if fragment.startswith("sha256=") else None
        if best is None or version > best[0]:
            best = (version, url, name, sha256)
    if best is None:
        raise RuntimeError(f"no pip wheel for Python {sys.version.split()[0]} at {page}")
    return best[1:]


def pip_from_index(python: Path) -> str:
    index = os.environ.get("PIP_INDEX_URL") or "https://pypi.org/simple"
    shown = re.sub(r"//[^/@]*@", "//", index)  # never print the index's password
    try:
        url, name, sha256 = newest_pip_wheel(index)
        body = fetch(url)
    except Exception as exc:  # one clear line below; the cause is in it
        raise RuntimeError(f"could not fetch pip from {shown}: {exc}") from None
    if sha256 and hashlib.sha256(body).hexdigest() != sha256:
        raise RuntimeError(f"{name} from {shown} does not match the index's sha256")
    with tempfile.TemporaryDirectory() as tmp:
        wheel = Path(tmp, name)
        wheel.write_bytes(body)
        # A pip wheel runs itself: python pip-X.whl/pip install pip-X.whl
        done = runs(str(python), f"{wheel}/pip", "install", "-q", "--no-index", str(wheel))
    if done.returncode:
        raise RuntimeError(f"installing {name} failed: {done.stderr.strip()[-500:]}")
    return f"{name} from {shown}"


def seed_pip(python: Path) -> str:
    """Put pip into the new environment; returns where it came from."""
    if runs(str(python), "-m", "ensurepip", "--default-pip").returncode == 0:
        return "ensurepip"
    if runs(sys.executable, "-m", "pip", "--version").returncode == 0:
        done = runs(sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "pip")
        if done.returncode == 0:
            return f"{sys.executable} -m pip"
    return pip_from_index(python)


def main(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-"):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    root, pip_args = Path(argv[0]), argv[1:]
    root.mkdir(parents=True, exist_ok=True)
    lock = os.open(root, os.O_RDONLY)
    fcntl.flock(lock, fcntl.LOCK_EX)  # released when this process exits
    python = root / "bin" / "python"
    if not pip_works(python):
        if any(root.iterdir()) and not (root / "pyvenv.cfg").exists():
            log(f"{root} is not empty and not a virtual environment; not touching it")
            return 2
        log(f"creating {root} with {sys.executable} (Python {sys.version.split()[0]})")
        venv.EnvBuilder(clear=True, symlinks=True, with_pip=False).create(root)
        try:
            source = seed_pip(python)
        except RuntimeError as exc:
            log(f"cannot put pip into {root}: no ensurepip ({FIX}), no pip, and {exc}")
            return 1
        log(f"pip from {source}")
    if pip_args:
        return subprocess.call([str(python), "-m", "pip", "install", *pip_args])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

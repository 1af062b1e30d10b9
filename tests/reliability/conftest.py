"""Fixtures for the reliability specs: fault proxies, live CLI processes, small filesystems.

* ``proxies`` — ``proxies(upstream, **options)`` starts a :class:`FaultProxy` stopped after the
  test; point the initializer's ENDPOINT / HF_ENDPOINT at ``proxy.url``.
* ``launch`` — starts the real CLI (``python -m initializers.<kind>``) in a clean environment and
  returns a :class:`Live` process whose stderr lines are collected as they come, so a test can
  wait for a log line, then signal or kill it.
* ``paged`` — ``paged(prefix)`` serves an S3 listing of a few keys a page whose faults the
  test sets (:mod:`tests.servers.paged_s3`); its URL.
* ``tmpfs`` — mounts a small tmpfs (root only; skipped with the reason otherwise).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import ACCESS_KEY, SECRET_KEY, Bucket, clean_env, tree
from tests.servers.faultproxy import FaultProxy, Request
from tests.servers.paged_s3 import Prefix, paged_s3

REPO = Path(__file__).resolve().parents[2]
KILLPOINT = Path(__file__).with_name("killpoint.py")
# What this run of the specs did, for docs/reliability.md: printed at the end of the session.
FIGURES: Counter[str] = Counter()


def pytest_terminal_summary(terminalreporter) -> None:  # type: ignore[no-untyped-def]
    if FIGURES:
        terminalreporter.section("reliability figures")
        for name, value in sorted(FIGURES.items()):
            terminalreporter.write_line(f"{name}: {value}")


def pytest_sessionfinish(session) -> None:  # type: ignore[no-untyped-def]
    """Under pytest-xdist (``make test``), each worker hands its figures to the controller."""
    handed_over = getattr(session.config, "workeroutput", None)
    if handed_over is not None:
        handed_over["reliability figures"] = dict(FIGURES)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:  # type: ignore[no-untyped-def]
    """The controller sums what its workers counted, for the summary above."""
    FIGURES.update(getattr(node, "workeroutput", {}).get("reliability figures", {}))


def assert_identical(out: Path, files: dict[str, bytes]) -> None:
    """``out`` holds exactly ``files``, byte for byte (compared by digest: no megabyte diffs)."""
    digest = {name: hashlib.sha256(body).hexdigest() for name, body in files.items()}
    got = {name: hashlib.sha256(body).hexdigest() for name, body in tree(out).items()}
    assert got == digest
    FIGURES["final trees verified byte for byte"] += 1
    FIGURES["bytes verified"] += sum(map(len, files.values()))


def dataset(seed: int, sizes: dict[str, int]) -> dict[str, bytes]:
    """Files of the given sizes with seeded random content (the same on every run)."""
    rng = random.Random(seed)
    return {name: rng.randbytes(size) for name, size in sizes.items()}


def fill(bucket: Bucket, prefix: str, files: dict[str, bytes]) -> None:
    for name, body in files.items():
        bucket.put(f"{prefix}/{name}", body)


def one_manifest(out: Path) -> dict:
    """The one manifest under ``out`` (no other, no leftover temporary), parsed."""
    assert sorted(p.name for p in out.rglob(".initializer-manifest*")) == [
        ".initializer-manifest.json"
    ]
    return json.loads((out / ".initializer-manifest.json").read_text())


def assert_each_hub_file_served_once(hub: object, files: dict[str, bytes]) -> None:
    """Each file's bytes left the Hub (API or CDN) in exactly one answered GET."""
    for name in files:
        served = [
            r
            for r in hub.requests  # type: ignore[attr-defined]
            if r.method == "GET" and r.path.endswith(name) and r.status in (200, 206)
        ]
        assert len(served) == 1, (name, served)


def is_object_get(request: Request) -> bool:
    """An S3 object GET (not a listing): what the proxies' faults and holds aim at."""
    return request.method == "GET" and "list-type" not in request.query


def s3_env(bucket: Bucket, endpoint: str, prefix: str, out: Path, **extra: str) -> dict[str, str]:
    """What the controller sets, with the endpoint pointing at a proxy (or the server itself)."""
    return {
        "STORAGE_URI": bucket.uri(prefix),
        "ENDPOINT": endpoint,
        "ACCESS_KEY_ID": ACCESS_KEY,
        "SECRET_ACCESS_KEY": SECRET_KEY,
        "OUTPUT_PATH": str(out),
        **extra,
    }


def stop_with_sigterm(live: Live, final: Path, within: float) -> None:
    """SIGTERM ``live``: it must exit 143 within ``within`` seconds, say how to resume, and
    leave no file at ``final``."""
    stopped_at = time.monotonic()
    live.signal(signal.SIGTERM)
    code = live.finish(timeout=60)
    took = time.monotonic() - stopped_at
    assert code == 143, live.stderr
    assert took < within, f"{took:.1f}s to stop"
    assert "rerun to resume" in live.stderr
    assert not final.exists()


def kill_before_rename_then_resume(
    launch: Callable[..., Live],
    run_initializer: Callable[..., object],
    kind: str,
    args: tuple[str, ...],
    env: dict[str, str],
    out: Path,
    files: dict[str, bytes],
    big: str,
) -> None:
    """SIGKILL the fetch just before ``big`` (64 MiB, complete in its .part) is renamed; the
    rerun must resume all of it from the journal, not fetch it again, and end byte-identical."""
    live = launch(kind, *args, env=env, kill_at=("os.rename", big, 1, "before"))
    assert live.finish(timeout=60) == -9, live.stderr
    rerun = run_initializer(kind, *args, env=env)
    assert rerun.code == 0, rerun.output  # type: ignore[attr-defined]
    assert "resuming 64.00 MiB already on disk" in rerun.stderr, rerun.stderr  # type: ignore[attr-defined]
    assert_identical(out, files)
    FIGURES["SIGKILLs survived (other schemes)"] += 1


def retry_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "retrying in" in line]


@pytest.fixture(autouse=True)
def _empty_the_bucket_afterwards(request: pytest.FixtureRequest) -> Iterator[None]:
    """These specs put hundreds of MiB into the session's in-memory S3: give it back."""
    bucket: Bucket | None = None
    if "bucket" in request.fixturenames:
        bucket = request.getfixturevalue("bucket")
    yield
    if bucket is not None:
        listing = bucket.client.list_objects_v2(Bucket=bucket.name)  # type: ignore[attr-defined]
        for obj in listing.get("Contents", []):
            bucket.client.delete_object(Bucket=bucket.name, Key=obj["Key"])  # type: ignore[attr-defined]


@pytest.fixture
def stable_bucket(
    s3_client: object, s3_endpoint: str, request: pytest.FixtureRequest
) -> Iterator[Bucket]:
    """A bucket named after the test, not the process: request paths, and so the proxy's seeded
    fault draws, are the same on every run."""
    name = "rel-" + hashlib.sha256(request.node.nodeid.encode()).hexdigest()[:20]
    s3_client.create_bucket(Bucket=name)  # type: ignore[attr-defined]
    bucket = Bucket(name, s3_client, s3_endpoint)
    yield bucket
    listing = s3_client.list_objects_v2(Bucket=name)  # type: ignore[attr-defined]
    for obj in listing.get("Contents", []):
        s3_client.delete_object(Bucket=name, Key=obj["Key"])  # type: ignore[attr-defined]
    s3_client.delete_bucket(Bucket=name)  # type: ignore[attr-defined]


@pytest.fixture
def paged() -> Iterator[Callable[[Prefix], str]]:
    """``paged(prefix)`` serves ``prefix`` (:mod:`tests.servers.paged_s3`) until the test ends;
    its endpoint's URL."""
    with contextlib.ExitStack() as stack:
        yield lambda prefix: stack.enter_context(paged_s3(prefix))


@pytest.fixture
def proxies() -> Iterator[Callable[..., FaultProxy]]:
    started: list[FaultProxy] = []

    def start(upstream: str, **options: object) -> FaultProxy:
        proxy = FaultProxy(upstream, **options).start()  # type: ignore[arg-type]
        started.append(proxy)
        return proxy

    yield start
    for proxy in started:
        proxy.stop()
        FIGURES["faults injected"] += proxy.total_injected
        for kind, count in proxy.injected.items():
            FIGURES[f"faults injected: {kind}"] += count


class Live:
    """A running initializer; its stderr is read line by line on a thread."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            argv,
            env=env,
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self.out_lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._out_reader = threading.Thread(target=self._read_stdout, daemon=True)
        self._out_reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.out_lines.append(line)

    @property
    def stdout(self) -> str:
        return "".join(self.out_lines)

    @property
    def stderr(self) -> str:
        return "".join(self.lines)

    def wait_for(self, text: str, timeout: float = 60.0) -> None:
        """Return once a stderr line contains ``text``; fail if the process ends first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(text in line for line in list(self.lines)):
                return
            if self.proc.poll() is not None:
                self._reader.join(timeout=5)
                if any(text in line for line in self.lines):
                    return
                code = self.proc.returncode
                raise AssertionError(f"exited {code} before {text!r}:\n{self.stderr}")
            time.sleep(0.01)
        self.kill()
        raise AssertionError(f"no {text!r} within {timeout}s:\n{self.stderr}")

    def finish(self, timeout: float = 120.0) -> int:
        """Wait for the exit code (the process is killed if it outlives ``timeout``)."""
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"still running after {timeout}s:\n{self.stderr}") from None
        self._reader.join(timeout=5)
        self._out_reader.join(timeout=5)
        return code

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self._reader.join(timeout=5)

    @property
    def seconds(self) -> float:
        return time.monotonic() - self.started


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Callable[..., Live]]:
    """``launch("dataset", env={...}, kill_at=None)`` → a :class:`Live` CLI process.

    ``kill_at=(event, substring, nth, when)`` runs the same CLI under ``killpoint.py``, which
    SIGKILLs it at the ``nth`` audit event (``os.rename`` / ``open``) naming ``substring``.
    """
    home = tmp_path / "live-home"
    home.mkdir(exist_ok=True)
    running: list[Live] = []

    def start(
        kind: str,
        *args: str,
        env: dict[str, str],
        kill_at: tuple[str, str, int, str] | None = None,
    ) -> Live:
        module = f"initializers.{kind}"
        if kill_at is None:
            argv = [sys.executable, "-m", module, *args]
        else:
            event, substring, nth, when = kill_at
            argv = [sys.executable, str(KILLPOINT), event, substring, str(nth), when, module, *args]
        live = Live(argv, clean_env(home, **env))
        running.append(live)
        return live

    yield start
    for live in running:
        if live.proc.poll() is None:
            live.kill()


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Callable[[str, int], Path]]:
    """``tmpfs("name", size_mib)`` → a freshly mounted tmpfs of that size, unmounted after."""
    mounted: list[Path] = []

    def mount(name: str, size_mib: int) -> Path:
        target = tmp_path / name
        target.mkdir()
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size_mib}m,mode=0755", "tmpfs", str(target)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")
        mounted.append(target)
        return target

    yield mount
    for target in reversed(mounted):
        subprocess.run(["umount", "-l", str(target)], check=False, capture_output=True)

"""Pods die mid-transfer: SIGKILL at random and at exact points of the commit protocol, SIGTERM.

After every kill the final names hold only complete, correct files; a rerun keeps what is on disk
(it reports how much), and the last run ends with the exact source tree and a valid manifest.
"""

from __future__ import annotations

import hashlib
import random
import re
import signal
import threading
import time
from pathlib import Path

import pytest

from initializers import transport
from initializers.errors import TransientError
from initializers.journal import CommitLog, RangeJournal
from initializers.manifest import find_problems
from initializers.progress import human_bytes
from tests.conftest import Bucket
from tests.reliability.conftest import (
    FIGURES,
    assert_identical,
    dataset,
    fill,
    is_object_get,
    s3_env,
    stop_with_sigterm,
)
from tests.servers.faultproxy import Fault

MIB = 1 << 20
CHECKPOINT = 4 * MIB  # the engine's journal granularity
WORKERS = 2
CLEAN_END = {".initializer.lock", ".initializer-manifest.json"}


def hidden_files(out: Path) -> set[str]:
    return {p.name for p in out.rglob(".*") if p.is_file()}


class FinalNameWatcher:
    """Polls the destination while runs come and go; any final-name file that is not
    byte-identical to the source is recorded (a partial file would be caught here)."""

    def __init__(self, out: Path, files: dict[str, bytes]) -> None:
        self.out = out
        self.expected = {name: hashlib.sha256(body).hexdigest() for name, body in files.items()}
        self.bad: list[str] = []
        self.checked = 0
        self._known: dict[str, tuple[int, int, int]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> FinalNameWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.scan()

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            self.scan()

    def scan(self) -> None:
        for name, digest in self.expected.items():
            path = self.out / name
            try:
                st = path.stat()
                identity = (st.st_ino, st.st_size, st.st_mtime_ns)
                if self._known.get(name) == identity:
                    continue
                actual = hashlib.sha256(path.read_bytes()).hexdigest()
            except FileNotFoundError:
                continue
            self._known[name] = identity
            self.checked += 1
            if actual != digest:
                self.bad.append(f"{name} (size {identity[1]})")


def journaled_bytes(out: Path, bucket: Bucket, prefix: str, files: dict[str, bytes]) -> int:
    """What a rerun can keep of unfinished files: the intervals their journals record."""
    kept = 0
    for name, body in files.items():
        final = out / name
        part = final.with_name(f".{final.name}.part")
        if not part.exists() or part.stat().st_size != len(body):
            continue
        head = bucket.client.head_object(Bucket=bucket.name, Key=f"{prefix}/{name}")  # type: ignore[attr-defined]
        identity = {"size": len(body), "version": head["ETag"].strip('"')}
        done = RangeJournal(final.with_name(f".{final.name}.part.journal"), identity).load()
        kept += sum(end - start for start, end in done)
    return kept


def written_bytes(out: Path, files: dict[str, bytes]) -> int:
    """Bytes on disk under the destination: complete files plus the blocks .part files hold
    (they are sparse: only what was written takes blocks)."""
    total = 0
    for name, body in files.items():
        final = out / name
        part = final.with_name(f".{final.name}.part")
        if final.exists():
            total += len(body)
        elif part.exists():
            total += min(part.stat().st_blocks * 512, len(body))
    return total


def committed_bytes(out: Path, files: dict[str, bytes]) -> int:
    return sum(len(body) for name, body in files.items() if (out / name).exists())


def test_sigkill_at_twelve_random_points_of_a_fetch_loses_no_byte_and_keeps_most_work(
    bucket, s3_endpoint, proxies, launch, run_initializer, tmp_path
):
    files = dataset(
        21,
        {
            "w/model-1.safetensors": 80 * MIB,  # three ranges each
            "w/model-2.safetensors": 80 * MIB,
            "w/model-3.safetensors": 80 * MIB,
            "w/model-4.safetensors": 80 * MIB,
            "w/extra.bin": 24 * MIB,
            **{f"meta/file-{i}.json": 40_000 + i * 150_000 for i in range(8)},
        },
    )
    fill(bucket, "d", files)
    proxy = proxies(s3_endpoint)  # no faults: it counts the bytes served
    out = tmp_path / "out"
    env = s3_env(bucket, proxy.url, "d", out, WORKERS=str(WORKERS))
    rng = random.Random(1207)
    kills, fetched, kept, expected_resume, lost_before = 0, [], [], 0, 0
    with FinalNameWatcher(out, files) as watcher:
        while kills < 12:
            before_run = proxy.body_bytes
            kept_before = committed_bytes(out, files) + expected_resume
            # Committed by earlier runs: recorded in the commit log (a file renamed just before a
            # kill, but not yet recorded, is fetched again), counted before this run commits any.
            present = len(CommitLog(out).load())
            live = launch("dataset", env=env)
            live.wait_for(": fetching ")
            plan = next(line for line in live.lines if ": fetching " in line)
            if expected_resume:
                assert f"resuming {human_bytes(expected_resume)} already on disk" in plan, plan
            assert f"fetching {len(files) - present} of {len(files)} files" in plan, plan
            target = before_run + rng.uniform(16, 40) * MIB  # a random point of this run
            while proxy.body_bytes < target and live.proc.poll() is None:
                time.sleep(0.002)
            if live.proc.poll() is not None:
                break  # finished before this kill point: nothing left to kill
            live.kill()
            kills += 1
            assert watcher.bad == [], watcher.bad
            on_disk = written_bytes(out, files)
            expected_resume = journaled_bytes(out, bucket, "d", files)
            kept_now = committed_bytes(out, files) + expected_resume
            fetched.append(on_disk - kept_before)
            kept.append(kept_now - kept_before)
            # By design a kill loses at most one checkpoint (plus the chunk in flight) per range
            # in flight, and the small files being fetched. Bytes an earlier kill lost stay on
            # disk, unjournaled, until this run refetches their hole: they count here too.
            lost = on_disk - kept_now
            assert lost <= lost_before + WORKERS * (CHECKPOINT + 2 * MIB), (lost, lost_before)
            lost_before = lost

        final = run_initializer("dataset", env=env)
    assert final.code == 0, final.output
    assert kills >= 10
    assert watcher.bad == [] and watcher.checked >= len(files)
    assert_identical(out, files)
    assert find_problems(out) == []
    assert hidden_files(out) == CLEAN_END
    # Most of what each killed run had written to disk was kept by the next run. Each kill
    # lands 16-40 MiB into a run with up to WORKERS x CHECKPOINT = 8 MiB not yet journaled,
    # so most is kept (measured 86-91% over three runs with 4 MiB checkpoints; 67-80% with the
    # earlier 8 MiB, when one run of the whole suite fell to 44%).
    assert sum(kept) >= 0.5 * sum(fetched), (kept, fetched)
    FIGURES["SIGKILLs survived (random points)"] += kills
    FIGURES["MiB on disk at the random kills"] += round(sum(fetched) / MIB)
    FIGURES["MiB of it kept by the reruns"] += round(sum(kept) / MIB)
    print(
        f"\nkills={kills}: kept {sum(kept) / MIB:.0f} of {sum(fetched) / MIB:.0f} MiB written "
        f"before the kills; {proxy.body_bytes / MIB:.0f} MiB served for "
        f"{sum(map(len, files.values())) / MIB:.0f} MiB"
    )


# (audit event, path substring, nth, before/after): the commit protocol's exact steps, in order.
def kill_points(out: Path) -> list[tuple[tuple[str, str, int, str], str]]:
    inside = f"{out}/"
    return [
        (("os.rename", inside, 1, "before"), "before the first file's rename"),
        (("os.rename", inside, 2, "after"), "right after a rename, before it is logged"),
        (("open", ".initializer-manifest.json.tmp", 1, "before"), "before the manifest write"),
        (("os.rename", ".initializer-manifest.json", 1, "before"), "before the manifest rename"),
        (("os.rename", ".initializer-manifest.json", 1, "after"), "just after the manifest rename"),
    ]


def test_sigkill_during_renames_and_the_manifest_write_never_exposes_a_partial_file(
    bucket, s3_endpoint, launch, run_initializer, tmp_path
):
    files = dataset(
        22, {"big.bin": 20 * MIB, "config.json": 300, "sub/a.txt": 4_000, "sub/b.txt": 70_000}
    )
    fill(bucket, "d", files)
    out = tmp_path / "out"
    env = s3_env(bucket, s3_endpoint, "d", out)
    with FinalNameWatcher(out, files) as watcher:
        for kill_at, moment in kill_points(out):
            live = launch("dataset", env=env, kill_at=kill_at)
            code = live.finish(timeout=60)
            assert code == -signal.SIGKILL, (moment, code, live.stderr)
            assert watcher.bad == [], (moment, watcher.bad)
            manifest_written = kill_at[1] == ".initializer-manifest.json" and kill_at[3] == "after"
            assert (out / ".initializer-manifest.json").exists() == manifest_written, moment
        assert find_problems(out) == []  # the last kill came after the manifest was in place
        again = run_initializer("dataset", env=env)
    assert again.code == 0, again.output
    assert "already complete" in again.stderr
    FIGURES["SIGKILLs survived (renames, manifest write)"] += len(kill_points(out))
    assert watcher.bad == []
    assert_identical(out, files)
    assert hidden_files(out) == CLEAN_END


def test_sigterm_during_a_retry_backoff_exits_143_within_seconds_and_the_rerun_resumes(
    bucket, s3_endpoint, proxies, launch, run_initializer, tmp_path
):
    body = dataset(23, {"big.bin": 20 * MIB})["big.bin"]
    fill(bucket, "d", {"big.bin": body})
    proxy = proxies(
        s3_endpoint, share=1.0, faults=[Fault.error(503)], match=is_object_get, max_in_a_row=10**9
    )
    proxy.force(Fault.short(12 * MIB), match=is_object_get)  # 12 MiB arrive, then only 503s
    out = tmp_path / "out"
    env = s3_env(bucket, proxy.url, "d", out, RETRIES="30")
    live = launch("dataset", env=env)
    live.wait_for("(attempt 4)")  # now sleeping about 4 s before the next attempt
    stop_with_sigterm(live, out / "big.bin", within=3.0)  # the backoff lasts about 4 s

    proxy.share = 0.0
    rerun = run_initializer("dataset", env=env)
    assert rerun.code == 0, rerun.output
    assert f"resuming {human_bytes(12 * MIB)} already on disk" in rerun.stderr
    assert (out / "big.bin").read_bytes() == body
    assert re.search(r"8\.00 MiB transferred", rerun.stderr), rerun.stderr
    FIGURES["SIGTERMs survived"] += 1


@pytest.mark.parametrize("stalled", ["before the headers", "mid-body"])
def test_sigterm_during_a_stalled_read_exits_143_at_once_not_after_the_read_timeout(
    stalled, bucket, s3_endpoint, proxies, launch, run_initializer, tmp_path
):
    body = dataset(29, {"big.bin": 20 * MIB})["big.bin"]
    fill(bucket, "d", {"big.bin": body})
    proxy = proxies(s3_endpoint, share=0.0)
    after = None if stalled == "before the headers" else 12 * MIB
    proxy.force(Fault.stall(600, after_bytes=after), match=is_object_get)
    out = tmp_path / "out"
    env = s3_env(bucket, proxy.url, "d", out, TIMEOUT="120")  # a read would wait 120 s
    live = launch("dataset", env=env)
    deadline = time.monotonic() + 30
    while not proxy.total_injected and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1.5)  # the bytes before the stall are through; the read now blocks
    stop_with_sigterm(live, out / "big.bin", within=5.0)

    rerun = run_initializer("dataset", env=env)
    assert rerun.code == 0, rerun.output
    assert (out / "big.bin").read_bytes() == body
    if after:
        assert f"resuming {human_bytes(after)} already on disk" in rerun.stderr
    FIGURES["SIGTERMs survived"] += 1


def test_a_connection_opened_just_after_a_stop_is_cut_too_instead_of_waiting_out_its_read(
    bucket, s3_endpoint, proxies, stop_undone_afterwards
):
    # A worker that checked the stop flag a moment before SIGTERM connects after the handler
    # cut the open connections; a CI run hung 30 s on exactly that with every request held.
    bucket.put("o/body.bin", b"x" * 4096, ACL="public-read")
    proxy = proxies(s3_endpoint, share=0.0)
    proxy.force(Fault.stall(600), match=is_object_get)
    transport.interrupt_reads()  # what the SIGTERM handler does
    http = transport.HttpTransport(connections=1, timeout=120)  # a read would wait 120 s
    started = time.monotonic()

    with pytest.raises(TransientError, match="connection failed"):
        http.open_range(f"{proxy.url}/{bucket.name}/o/body.bin", {}, 0, 4096, "body.bin")
    assert time.monotonic() - started < 5.0

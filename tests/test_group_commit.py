"""Group commit: a batch of verified files is made durable once, then renamed and recorded."""

from __future__ import annotations

import errno
import os
import threading
import time
from pathlib import Path

import pytest

from initializers import commits
from initializers.commits import GroupCommit, Verified
from initializers.fetching import FileFetcher
from initializers.filejob import CHECKPOINT, FileJob
from initializers.journal import CommitLog
from initializers.progress import Progress
from initializers.retry import RetryPolicy
from initializers.sources.local import LocalSource


def verified(dest: Path, name: str, body: bytes, done: list[str]) -> tuple[int, Verified]:
    part = dest / f".{name}.part"
    fd = os.open(part, os.O_RDWR | os.O_CREAT, 0o644)
    os.write(fd, body)
    file = Verified(name, part, dest / name, len(body), None, "v1", lambda: done.append(name))
    return fd, file


def queue_one_batch_and_one_more(group: GroupCommit, dest: Path, done: list[str]) -> None:
    """A full batch (committed in the background) and a file left queued behind it."""
    for i in range(commits.MAX_FILES + 1):
        fd, file = verified(dest, f"f{i}", b"y", done)
        group.add(fd, file)
        os.close(fd)


def test_final_names_appear_only_after_every_file_of_the_batch_is_fsynced(tmp_path, monkeypatch):
    seen_at_fsync: list[list[str]] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        seen_at_fsync.append(sorted(p.name for p in tmp_path.iterdir() if p.suffix != ".jsonl"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    group, done = GroupCommit(tmp_path, CommitLog(tmp_path)), []
    for name in ("a.bin", "b.bin"):
        fd, file = verified(tmp_path, name, name.encode() * 100, done)
        group.add(fd, file)
        os.close(fd)
    assert not (tmp_path / "a.bin").exists() and done == []  # waiting for its batch
    group.flush()
    # One fsync per file, all before the first rename (the commit log's own come after).
    assert seen_at_fsync[:2] == [[".a.bin.part", ".b.bin.part"]] * 2
    assert (tmp_path / "a.bin").read_bytes() == b"a.bin" * 100
    assert sorted(group.records) == sorted(CommitLog(tmp_path).load()) == ["a.bin", "b.bin"]
    assert done == ["a.bin", "b.bin"]


def test_making_a_batch_durable_syncs_its_own_files_not_the_whole_filesystem(tmp_path, monkeypatch):
    # syncfs would also wait for every other writer of the volume (other pods, on a node's disk).
    synced: list[str] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "sync", lambda: synced.append("sync"))
    monkeypatch.setattr(
        os, "fsync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")), real_fsync(fd))
    )
    group, done = GroupCommit(tmp_path, CommitLog(tmp_path)), []
    for name in ("a.bin", "b.bin", "c.bin"):
        fd, file = verified(tmp_path, name, b"x", done)
        group.add(fd, file)
        os.close(fd)
    group.flush()
    parts = [str(tmp_path / f".{name}.part") for name in ("a.bin", "b.bin", "c.bin")]
    assert synced[:3] == parts
    assert "sync" not in synced
    assert sorted(CommitLog(tmp_path).load()) == ["a.bin", "b.bin", "c.bin"]


def wait_until(condition, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_a_full_batch_is_committed_in_the_background_and_adding_never_waits_for_it(
    tmp_path, monkeypatch
):
    release = threading.Event()
    real_fsync = os.fsync

    def slow_fsync(fd: int) -> None:
        release.wait(10)  # the disk is slow: add() must not wait for it
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", slow_fsync)
    group, done = GroupCommit(tmp_path, CommitLog(tmp_path)), []
    queue_one_batch_and_one_more(group, tmp_path, done)
    assert done == []  # the batch is waiting for its fsyncs; the adds all returned
    release.set()
    assert wait_until(lambda: len(done) >= commits.MAX_FILES)  # without an explicit flush
    assert len(CommitLog(tmp_path).load()) >= commits.MAX_FILES
    group.flush()
    assert len(done) == commits.MAX_FILES + 1


def test_a_stop_lets_the_batch_being_committed_finish_its_records_and_commits_no_more(
    tmp_path, monkeypatch
):
    """A stop ends the process with ``os._exit``, which does not wait for the background
    batch: between its renames and its records, whole files stood under final names that no
    record named (CI, a SIGTERM spec under load). ``settle`` waits for that batch only."""
    renamed = threading.Event()
    real_replace = os.replace

    def replace_then_pause(src: object, dst: object) -> None:
        real_replace(src, dst)
        renamed.set()
        time.sleep(0.002)  # the batch is mid-way through its renames when the stop comes

    monkeypatch.setattr(os, "replace", replace_then_pause)
    group, done = GroupCommit(tmp_path, CommitLog(tmp_path)), []
    queue_one_batch_and_one_more(group, tmp_path, done)
    assert renamed.wait(10)
    group.settle()
    final = {p.name for p in tmp_path.iterdir() if not p.name.startswith(".")}
    recorded = set(CommitLog(tmp_path).load())
    # Every file under its final name is recorded: the batch, and the last file if the
    # flusher took it too (it waited past MAX_AGE on a slow machine).
    assert final == recorded and len(final) >= commits.MAX_FILES


def test_a_failure_committing_in_the_background_is_raised_by_the_next_add_and_by_flush(
    tmp_path, monkeypatch
):
    def full_disk(src, dst) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", full_disk)
    group, done = GroupCommit(tmp_path, CommitLog(tmp_path)), []
    for i in range(commits.MAX_FILES):
        fd, file = verified(tmp_path, f"f{i}", b"y", done)
        group.add(fd, file)
        os.close(fd)
    fd, file = verified(tmp_path, "late", b"y", done)
    assert wait_until(lambda: _raises_enospc(lambda: group.add(fd, file)))
    os.close(fd)
    with pytest.raises(OSError) as raised:
        group.flush()
    assert raised.value.errno == errno.ENOSPC
    assert done == [] and not (tmp_path / "f0").exists()  # nothing renamed, nothing recorded


def _raises_enospc(call) -> bool:
    try:
        call()
    except OSError as exc:
        return exc.errno == errno.ENOSPC
    return False


def test_a_file_reaches_its_commit_with_its_journal_closed_by_the_worker_that_queued_it(tmp_path):
    # The group's thread may commit a file the moment it is queued, and removing its journal
    # closes it there; the worker closing it too raced with that (a double close hit a
    # descriptor another file had reused: EBADF in that file's next write).
    body = os.urandom(2 * CHECKPOINT)  # journaled: more than one checkpoint
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "shard.bin").write_bytes(body)
    dest = tmp_path / "dest"
    dest.mkdir()
    source = LocalSource(tmp_path / "src")
    (remote,) = source.list().files
    job = FileJob(remote, dest)
    job.plan()
    open_at_commit: list[list[str]] = []

    class Watched(GroupCommit):
        def add(self, fd: int, file: Verified) -> None:
            fds = os.listdir("/proc/self/fd")
            open_at_commit.append([os.path.realpath(f"/proc/self/fd/{n}") for n in fds])
            super().add(fd, file)

    group = Watched(dest, CommitLog(dest))
    progress = Progress(1, len(body), 0)
    fetcher = FileFetcher(source, RetryPolicy(), threading.Event(), progress, group)
    for start, end in job.ranges:
        fetcher.fetch_range(job, start, end)
        job.range_finished()
    assert job.journal.path.exists()  # the fetch did keep a journal
    fetcher.commit(job)
    group.flush()
    assert str(job.journal.path) not in open_at_commit[0]
    assert (dest / "shard.bin").read_bytes() == body
    assert not job.journal.path.exists()  # removed by the commit

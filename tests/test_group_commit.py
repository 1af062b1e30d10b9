"""Group commit: a batch of verified files is made durable once, then renamed and recorded."""

from __future__ import annotations

import os
from pathlib import Path

from initializers import commits
from initializers.commits import GroupCommit, Verified
from initializers.journal import CommitLog


def verified(dest: Path, name: str, body: bytes, done: list[str]) -> tuple[int, Verified]:
    part = dest / f".{name}.part"
    fd = os.open(part, os.O_RDWR | os.O_CREAT, 0o644)
    os.write(fd, body)
    file = Verified(name, part, dest / name, len(body), None, "v1", lambda: done.append(name))
    return fd, file


def test_final_names_appear_only_after_the_batch_is_made_durable(tmp_path, monkeypatch):
    seen_at_sync: list[list[str]] = []

    def syncfs(fd: int) -> bool:
        seen_at_sync.append(sorted(p.name for p in tmp_path.iterdir()))
        return True

    monkeypatch.setattr(commits, "syncfs", syncfs)
    group, done = GroupCommit(tmp_path, CommitLog(tmp_path)), []
    for name in ("a.bin", "b.bin"):
        fd, file = verified(tmp_path, name, name.encode() * 100, done)
        group.add(fd, file)
        os.close(fd)
    assert not (tmp_path / "a.bin").exists() and done == []  # waiting for its batch
    group.flush()
    assert seen_at_sync == [[".a.bin.part", ".b.bin.part"]]  # one sync, before any rename
    assert (tmp_path / "a.bin").read_bytes() == b"a.bin" * 100
    assert sorted(group.records) == sorted(CommitLog(tmp_path).load()) == ["a.bin", "b.bin"]
    assert done == ["a.bin", "b.bin"]


def test_without_syncfs_each_file_of_the_batch_is_fsynced(tmp_path, monkeypatch):
    fsynced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(commits, "syncfs", None)
    monkeypatch.setattr(os, "fsync", lambda fd: (fsynced.append(fd), real_fsync(fd)))
    group, done = GroupCommit(tmp_path, CommitLog(tmp_path)), []
    for name in ("a.bin", "b.bin", "c.bin"):
        fd, file = verified(tmp_path, name, b"x", done)
        group.add(fd, file)
        os.close(fd)
    group.flush()
    assert len(fsynced) == 3
    assert sorted(CommitLog(tmp_path).load()) == ["a.bin", "b.bin", "c.bin"]


def test_the_worker_whose_file_fills_a_batch_flushes_it(tmp_path):
    group, done = GroupCommit(tmp_path, CommitLog(tmp_path)), []
    for i in range(commits.MAX_FILES):
        fd, file = verified(tmp_path, f"f{i}", b"y", done)
        group.add(fd, file)
        os.close(fd)
    assert len(done) == commits.MAX_FILES  # committed without an explicit flush
    assert len(CommitLog(tmp_path).load()) == commits.MAX_FILES

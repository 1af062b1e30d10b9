"""Each run's destination is a fresh folder, under a parent that ext4 spreads (+T)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from benchmarks import destinations


def _attributes(folder: Path) -> str:
    return subprocess.run(
        ["lsattr", "-d", str(folder)], check=True, capture_output=True, text=True
    ).stdout.split()[0]


def _filesystem(folder: Path) -> str:
    return subprocess.run(
        ["findmnt", "-n", "-o", "FSTYPE", "-T", str(folder)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


def test_on_ext4_the_parent_is_marked_to_spread_the_folders_made_in_it(tmp_path: Path) -> None:
    if _filesystem(tmp_path) != "ext4":
        pytest.skip(f"{tmp_path} is not on ext4")
    parent = tmp_path / "runs"
    line = destinations.spread(parent)
    assert "T" in _attributes(parent)
    assert line.endswith("(chattr +T)")


def test_where_ext4_attributes_do_not_apply_the_folder_is_used_as_it_is_and_the_line_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A filesystem without the attribute cannot be mounted here: chattr answers as on one.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    chattr = bin_dir / "chattr"
    chattr.write_text(
        '#!/bin/sh\necho "chattr: Operation not supported while reading flags on $2" >&2\nexit 1\n'
    )
    chattr.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    parent = tmp_path / "runs"
    line = destinations.spread(parent)
    assert parent.is_dir()
    assert "Operation not supported" in line and line.endswith("not spread)")

    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no chattr at all
    assert destinations.spread(tmp_path / "runs2").endswith("(chattr not found: not spread)")

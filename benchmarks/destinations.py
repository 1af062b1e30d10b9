"""Where the runs' destinations go: each in a fresh folder, under a parent ext4 spreads (``+T``).

Why: this machine's root filesystem is ext4 without a journal, and there ext4 skips, on every
file it creates, each free inode of the block group that was freed within the last minute or
more (``recently_deleted``, checked only without a journal). Each run's destination is removed
before the next, so a run paid for the files of the runs before it, in proportion to how many
of them shared its block groups: measured with ``perf`` on the S3 dataset, ~30% of ours' samples
(~1.5 CPU-seconds) and ~18% of s5cmd's were in that scan, and ours' system time grew from 1.44 s
to 1.71 s and 2.01 s over three runs in a row where s5cmd's stayed at 1.38-1.43 s (ours' 2,004
files landed in ~6 block groups, s5cmd's in ~41). A node's disk with a journal never pays it.

Folders made directly in a folder marked ``+T`` ("top of a directory hierarchy") are placed by
ext4 as top-level ones, spread over the disk by their names' hash; a fresh name per run then
starts each run's tree away from the inodes the last runs freed. With it, three runs in a row of
either tool kept their system time flat (ours 1.36-1.42 s, s5cmd 1.36-1.56 s). Elsewhere (not
ext4, no ``chattr``), the folder is used as it is and the report says so.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path


def spread(folder: Path) -> str:
    """Make ``folder`` and mark it ``+T``; one line for the report saying what was done."""
    folder.mkdir(parents=True, exist_ok=True)
    try:
        subprocess.run(["chattr", "+T", str(folder)], check=True, capture_output=True, text=True)
    except FileNotFoundError:
        return "each run's in a fresh folder (chattr not found: not spread)"
    except subprocess.CalledProcessError as exc:
        why = exc.stderr.strip().splitlines()[-1] if exc.stderr.strip() else "failed"
        return f"each run's in a fresh folder (chattr +T: {why}: not spread)"
    return "each run's in a fresh folder, made where ext4 spreads folders (chattr +T)"


class Kept:
    """Destinations kept until the benchmark ends, so no run meets what the runs before it
    freed; past ``budget`` files, removed all at once, synced, and left a minute.

    Why: with 200,000 files removed between rounds of the many-files benchmark (at 38ee3eb), 5
    of 10 runs at 100,000 objects took 1.5-2.4 times as long as the others, with 1.5-2.4 times
    the CPU, whichever tool ran; the next round's runs met the freed inodes (ext4 without a
    journal skips those freed in the last 60 s, 360 s while their table is unsynced) and the
    removal's writeback. Removed between scenarios instead (1,000,000 files, synced, a minute
    left), the next scenario's first three rounds of five were as noisy. A million-file tree
    kept per run would fill the disk: past ``budget``, they go (and the pause is paid)."""

    PAUSE_S = 61.0

    def __init__(self, budget: int = 2_500_000) -> None:  # ~14 GiB of 1-8 KiB files
        self.budget = budget
        self._paths: list[Path] = []
        self._files = 0

    def add(self, path: Path, files: int) -> None:
        self._paths.append(path)
        self._files += files
        if self._files > self.budget:
            self.clear()

    def clear(self, settle: bool = True) -> None:
        """Remove what is kept; ``settle``: sync, then wait out the minute (not enough where a
        new file's inode shares a table block with freed ones still unsynced: 6 minutes)."""
        if not self._paths:
            return
        for path in self._paths:
            shutil.rmtree(path, ignore_errors=True)
        self._paths, self._files = [], 0
        if settle:
            os.sync()
            time.sleep(self.PAUSE_S)

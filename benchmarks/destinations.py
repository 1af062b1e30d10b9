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

import subprocess
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

"""Wait until required asset folders carry a valid initializer manifest.

The dataset/model initializers write ``.initializer-manifest.json`` last; a folder is ready when
``initializers.manifest.find_problems`` finds nothing wrong with it (manifest present, every file
still the size and mtime the initializer left). Training never starts on a half-fetched model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from initializers.entryhold import hold_for_training
from initializers.errors import NotFoundError
from initializers.launchers.polling import wait_until_ready
from initializers.manifest import check_tree, manifest_path, read_manifest_head


@dataclass(frozen=True)
class Asset:
    """A complete asset folder, as the topology printout describes it."""

    path: Path
    source: str
    files: int
    total_bytes: int


def _problems(paths: Sequence[Path], totals: dict[Path, tuple[int, int]]) -> list[str]:
    """What keeps ``paths`` from being complete; each one's (files, bytes) into ``totals``."""
    problems = []
    for path in paths:
        found, files, size = check_tree(path)
        problems += found
        totals[path] = (files, size)
    return problems


def wait_for_assets(paths: Sequence[Path], timeout: float) -> list[Asset]:
    """Block until every folder in ``paths`` is complete; raise NotFoundError after ``timeout``."""
    if not paths:
        return []
    totals: dict[Path, tuple[int, int]] = {}
    problems = wait_until_ready(
        lambda: _problems(paths, totals),
        what="assets " + ", ".join(map(str, paths)),
        timeout=timeout,
    )
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise NotFoundError(
            f"required assets not complete after {timeout:g}s: {problems[0]}{more}; check that "
            "the dataset/model initializer finished (kubectl logs), or raise --wait-timeout "
            "(KF_WAIT_TIMEOUT)"
        )
    assets = []
    for path in paths:
        hold_for_training(path)  # a cache entry stays while the exec'd training runs
        head = read_manifest_head(manifest_path(path))
        if head is None:  # replaced between the check and now: say so rather than guess
            raise NotFoundError(f"{path} lost its initializer manifest while the shim started")
        assets.append(Asset(path, head.source, *totals[path]))
    return assets

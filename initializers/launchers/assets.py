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
from initializers.manifest import find_problems, manifest_path, manifest_totals, read_manifest_head


@dataclass(frozen=True)
class Asset:
    """A complete asset folder, as the topology printout describes it."""

    path: Path
    source: str
    files: int
    total_bytes: int


def _problems(paths: Sequence[Path]) -> list[str]:
    return [problem for path in paths for problem in find_problems(path)]


def wait_for_assets(paths: Sequence[Path], timeout: float) -> list[Asset]:
    """Block until every folder in ``paths`` is complete; raise NotFoundError after ``timeout``."""
    if not paths:
        return []
    problems = wait_until_ready(
        lambda: _problems(paths), what="assets " + ", ".join(map(str, paths)), timeout=timeout
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
        head, totals = read_manifest_head(manifest_path(path)), manifest_totals(path)
        if head is None or totals is None:  # replaced between the check and now: say so
            raise NotFoundError(f"{path} lost its initializer manifest while the shim started")
        assets.append(Asset(path, head.source, *totals))
    return assets

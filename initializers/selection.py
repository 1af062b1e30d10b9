"""Which listed files to fetch: allow/ignore globs, the model's weight-format choice, conflicts."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from initializers.patterns import is_selected, matches_any
from initializers.sources.base import RemoteFile

log = logging.getLogger(__name__)

SAFETENSORS = ("*.safetensors",)


@dataclass
class Selection:
    files: list[RemoteFile]
    filtered_out: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    weights_note: str | None = None


def select(
    files: list[RemoteFile],
    allow: tuple[str, ...],
    ignore: tuple[str, ...],
    *,
    fallback_weights: tuple[str, ...] = (),
    patterns_are_default: bool = False,
) -> Selection:
    """Apply the patterns; with default model patterns and no safetensors, take the fallback.

    The fallback only ever replaces *default* patterns: a user who set ALLOW_PATTERNS gets
    exactly what they asked for.
    """
    note = None
    if fallback_weights and patterns_are_default:
        if any(matches_any(f.path, SAFETENSORS) for f in files):
            note = "weights: *.safetensors found; skipping other weight formats"
        else:
            allow = allow + fallback_weights
            ignore = tuple(p for p in ignore if p not in fallback_weights)
            note = (
                f"weights: no *.safetensors in the source; falling back to "
                f"{', '.join(fallback_weights)}"
            )
    chosen, filtered = [], []
    for remote in files:
        (chosen if is_selected(remote.path, allow, ignore) else filtered).append(remote)
    chosen, conflicts = _drop_file_folder_conflicts(chosen)
    return Selection(chosen, [f.path for f in filtered], conflicts, note)


def _drop_file_folder_conflicts(files: list[RemoteFile]) -> tuple[list[RemoteFile], list[str]]:
    """A key that is also a folder prefix (``a`` and ``a/b``) cannot be a file on disk."""
    folders: set[str] = set()
    for file in files:
        folder = file.path.rpartition("/")[0]
        while folder and folder not in folders:  # its ancestors are in already, if it is
            folders.add(folder)
            folder = folder.rpartition("/")[0]
    kept = [f for f in files if f.path not in folders]
    conflicts = [f.path for f in files if f.path in folders]
    return kept, conflicts

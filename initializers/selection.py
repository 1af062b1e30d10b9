"""Which listed files to fetch: allow/ignore globs, the model's weight-format choice, conflicts."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from initializers.filetable import BATCH, FileTable, as_table
from initializers.patterns import is_selected, matches_any
from initializers.sources.base import RemoteFile

log = logging.getLogger(__name__)

SAFETENSORS = ("*.safetensors",)


SHOWN = 5  # filtered-out paths the log names


@dataclass
class Selection:
    files: FileTable
    filtered_out: list[str] = field(default_factory=list)  # the first SHOWN of them
    filtered_count: int = 0
    conflicts: list[str] = field(default_factory=list)
    weights_note: str | None = None


def select(
    files: Iterable[RemoteFile],
    allow: tuple[str, ...],
    ignore: tuple[str, ...],
    *,
    fallback_weights: tuple[str, ...] = (),
    patterns_are_default: bool = False,
) -> Selection:
    """Apply the patterns; with default model patterns and no safetensors, take the fallback.

    The fallback only ever replaces *default* patterns: a user who set ALLOW_PATTERNS gets
    exactly what they asked for. The chosen files go to a table beside the listing's.
    """
    listed = as_table(files)
    note = None
    if fallback_weights and patterns_are_default:
        if any(matches_any(path, SAFETENSORS) for _, path in listed.paths()):
            note = "weights: *.safetensors found; skipping other weight formats"
        else:
            allow = allow + fallback_weights
            ignore = tuple(p for p in ignore if p not in fallback_weights)
            note = (
                f"weights: no *.safetensors in the source; falling back to "
                f"{', '.join(fallback_weights)}"
            )
    selection = Selection(listed, weights_note=note)

    def left_out() -> Iterator[int]:
        for row, path in listed.paths():
            if not is_selected(path, allow, ignore):
                selection.filtered_count += 1
                if len(selection.filtered_out) < SHOWN:
                    selection.filtered_out.append(path)
                yield row

    chosen = listed.without(left_out())
    conflicts = _file_folder_conflicts(chosen)
    selection.conflicts = [path for _, path in conflicts]
    selection.files = chosen.without(row for row, _ in conflicts)
    return selection


def _file_folder_conflicts(files: FileTable) -> list[tuple[int, str]]:
    """Paths that are also another path's folder (``a`` and ``a/b``): they cannot be a file
    on disk. The folders go to a table: a tree of a million files may have as many."""
    folders = files.scratch.new_name("folders")
    files.db.execute(f"CREATE TABLE {folders} (path TEXT PRIMARY KEY)")
    last = ""
    batch: list[tuple[str]] = []
    for _, path in files.paths():
        folder = path.rpartition("/")[0]
        if folder == last:  # files of one folder mostly come together: its ancestors are in
            continue
        last = folder
        while folder:
            batch.append((folder,))
            folder = folder.rpartition("/")[0]
        if len(batch) >= BATCH:
            files.db.executemany(f"INSERT OR IGNORE INTO {folders} VALUES (?)", batch)
            batch.clear()
    files.db.executemany(f"INSERT OR IGNORE INTO {folders} VALUES (?)", batch)
    return files.db.execute(
        f"SELECT seq, path FROM {files.name} WHERE path IN (SELECT path FROM {folders}) "
        "ORDER BY seq"
    ).fetchall()

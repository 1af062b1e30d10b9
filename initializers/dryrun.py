"""``--dry-run``: what a run would do, planned exactly as a run plans it, and nothing written.

The listing, the patterns and the model's weight preference, the up-to-date check against the
destination's manifest, the asset store's entry and a shard's share are all worked out as a run
would; then each file is printed with what the run would do with it (``fetch``, ``keep``, or
``remove`` for a stale one) and its size, and the totals. No lock, no bookkeeping file, no folder
is made: the destination is only read (the run's scratch table lives under TMPDIR and goes).
Text lines on stdout, or with ``--log-format json`` one JSON object per file and a summary.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from initializers.filetable import as_table
from initializers.journal import CommitLog
from initializers.manifest import manifest_path
from initializers.planning import Destination, Plan
from initializers.progress import human_bytes
from initializers.selection import Chooser
from initializers.sources.base import Listing, Order, RemoteFile


@dataclass
class Totals:
    files: int = 0
    bytes: int = 0
    fetch: int = 0
    fetch_bytes: int = 0
    keep: int = 0
    remove: int = 0


class Printer:
    """One line (or JSON object) per file, then the summary, on stdout."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self.totals = Totals()

    def file(self, action: str, path: str, size: int | None) -> None:
        totals = self.totals
        if action == "remove":
            totals.remove += 1
        else:
            totals.files += 1
            totals.bytes += size or 0
            if action == "fetch":
                totals.fetch += 1
                totals.fetch_bytes += size or 0
            else:
                totals.keep += 1
        if self.as_json:
            print(json.dumps({"action": action, "path": path, "size": size}))
        else:
            shown = "" if size is None else human_bytes(size)
            print(f"{action:<6} {shown:>10}  {path}")

    def summary(self, dest: Path, notes: list[str]) -> None:
        t = self.totals
        if self.as_json:
            summary = {"files": t.files, "bytes": t.bytes, "fetch": t.fetch,
                       "fetch_bytes": t.fetch_bytes, "keep": t.keep, "remove": t.remove,
                       "complete": not t.fetch and not t.remove, "destination": str(dest),
                       "notes": notes}  # fmt: skip
            print(json.dumps({"summary": summary}))
            return
        state = (
            "already complete: a run would fetch nothing"
            if not t.fetch and not t.remove
            else f"a run would fetch {t.fetch} ({human_bytes(t.fetch_bytes)}), keep {t.keep} "
            f"and remove {t.remove}"
        )
        print(f"dry run: {t.files} files ({human_bytes(t.bytes)}) for {dest}; {state}")
        for note in notes:
            print(f"dry run: {note}")
        print("dry run: nothing was written")


def plan_folder(
    printer: Printer,
    dest: Path,
    files: Iterable[RemoteFile] | Chooser,
    source_uri: str,
    revision: str | None,
    label: str,
) -> None:
    """Plan ``files`` (chosen, or a chooser over a listing) against ``dest`` as the engine
    would, and print each file's fate."""
    chooser = (
        files
        if isinstance(files, Chooser)
        else Chooser(Listing(revision, as_table(files), order=Order.TREE))
    )
    where = Destination(dest, manifest_path(dest), CommitLog(dest), label)
    plan = Plan(where, chooser, source_uri, revision, threading.Event(), dry=True)
    plan.listing.complete()
    plan.advance(done=True)
    for path, record in plan.records():
        printer.file("keep", path, record.size)
    for remote in plan.todo:
        printer.file("fetch", remote.path, remote.size)
    for path in plan.outcome.removed:
        printer.file("remove", path, None)

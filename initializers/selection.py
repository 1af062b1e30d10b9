"""Which listed files to fetch: allow/ignore globs, the model's weight-format choice, conflicts.

The choice is made page by page as a listing arrives (:class:`Chooser`), so fetching can start
with the first page. Two rules need more than a page:

- a key that is also another key's folder (``a`` beside ``a/b``) cannot be a file on disk: the
  folder wins. In a listing sorted by key (S3, GCS, Azure) every ``a/...`` comes before ``a0``,
  so ``a`` is held only until the listing passes ``a0``. A tree (a local folder, a git
  commit) has no such pairs. A listing of unknown order is decided once it is all in.
- the model's weight-format fallback (no ``*.safetensors`` anywhere: take ``*.bin``) needs the
  whole listing: a run that applies it lists everything before choosing anything.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from initializers.errors import InitializerError, NotFoundError
from initializers.filetable import BATCH, FileTable, as_table
from initializers.patterns import is_selected, matches_any
from initializers.sources.base import Listing, Order

log = logging.getLogger(__name__)

SAFETENSORS = ("*.safetensors",)
SHOWN = 5  # filtered-out paths the log names


@dataclass(frozen=True)
class Rules:
    """What a user asked to fetch."""

    allow: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    fallback_weights: tuple[str, ...] = ()
    patterns_are_default: bool = False

    @property
    def needs_whole_listing(self) -> bool:
        """The weight-format fallback is decided on the whole listing. It only ever replaces
        *default* patterns: a user who set ALLOW_PATTERNS gets exactly what they asked for."""
        return bool(self.fallback_weights) and self.patterns_are_default


class Chooser:
    """Decides, a batch of listed files at a time, which of them to fetch; says why the others
    are left out once the listing is complete (:meth:`report`)."""

    def __init__(self, listing: Listing, rules: Rules = Rules(), where: str = "the source") -> None:
        self.listing = listing
        self.where = where  # the source, as the messages name it
        self.listed = as_table(listing.files)
        self.order = listing.order
        self.allow, self.ignore = rules.allow, rules.ignore
        self.weights_note: str | None = None
        if rules.needs_whole_listing:
            self._prefer_weights(rules)
            log.info("%s", self.weights_note)
        self.filtered_out: list[str] = []  # the first SHOWN of them
        self.filtered_count = 0
        self.conflicts: list[str] = []
        self.chosen = 0
        self._seen = 0  # the listing's rows looked at so far
        self._skipped_seen = 0
        self._last = ""  # the greatest path seen (Order.KEYS)
        self.repeated = 0  # keys a sorted listing gave twice in a row (Order.KEYS)
        self._held: list[tuple[int, str]] = []  # chosen, until the listing passes them
        self._folders = ""
        if self.order is not Order.TREE:
            self._folders = self.listed.scratch.new_name("folders")
            self.listed.db.execute(f"CREATE TABLE {self._folders} (path TEXT PRIMARY KEY)")

    def _prefer_weights(self, rules: Rules) -> None:
        assert self.listing.rest is None, "the weight-format fallback needs the whole listing"
        if any(matches_any(path, SAFETENSORS) for _, path in self.listed.paths()):
            self.weights_note = "weights: *.safetensors found; skipping other weight formats"
            return
        self.allow = rules.allow + rules.fallback_weights
        self.ignore = tuple(p for p in rules.ignore if p not in rules.fallback_weights)
        self.weights_note = (
            f"weights: no *.safetensors in the source; falling back to "
            f"{', '.join(rules.fallback_weights)}"
        )

    def chosen_table(self) -> FileTable:
        """A complete listing's chosen files: a view of its table."""
        return self.listed.only(seq for rows in self.take(done=True) for seq in rows)

    def take(self, done: bool, limit: int | None = None) -> Iterator[list[int]]:
        """The rows listed since the last call that are decided now and chosen, in batches;
        ``done``: the listing is complete, so every row is decided; ``limit``: look at no more
        than that many rows now (the rest at the next call)."""
        assert not (done and limit), "a complete listing is decided whole"
        self._report_skipped()
        self.listed.flush()
        if self.order is Order.UNKNOWN:
            if done:
                yield from self._take_all()
            return
        rows = self.listed.db.execute(
            f"SELECT seq, path FROM {self.listed.name} WHERE seq > ? ORDER BY seq LIMIT ?",
            (self._seen, -1 if limit is None else limit),  # SQLite: a negative LIMIT is none
        )
        while batch := rows.fetchmany(BATCH):
            self._seen = batch[-1][0]
            chosen = [(seq, path) for seq, path in batch if self._allowed(path)]
            if self.order is Order.TREE:
                released = [seq for seq, _ in chosen]
            else:
                released = self._pass(batch, chosen)
            if released:
                self.chosen += len(released)
                yield released
        if done and self._held:
            released = self._without_conflicts(self._held)
            self._held = []
            self.chosen += len(released)
            yield released

    def _allowed(self, path: str) -> bool:
        if is_selected(path, self.allow, self.ignore):
            return True
        self.filtered_count += 1
        if len(self.filtered_out) < SHOWN:
            self.filtered_out.append(path)
        return False

    def _pass(self, batch: list[tuple[int, str]], chosen: list[tuple[int, str]]) -> list[int]:
        """Order.KEYS: note the batch's folders, then release what the listing has passed.
        A key given again right after itself (a server whose pages overlap by a key) is taken
        once: two jobs for one path would have two writers."""
        repeated = set()
        for seq, path in batch:
            if path < self._last:
                self._out_of_order(path)
                return []
            if path == self._last:
                repeated.add(seq)
            self._last = path
        if repeated:
            self.repeated += len(repeated)
            chosen = [(seq, path) for seq, path in chosen if seq not in repeated]
        self._add_folders(path for _, path in chosen)
        self._held.extend(chosen)
        passed = [(seq, path) for seq, path in self._held if path + "0" <= self._last]
        if passed:
            self._held = [(seq, path) for seq, path in self._held if path + "0" > self._last]
        return self._without_conflicts(passed)

    def _out_of_order(self, path: str) -> None:
        """A listing said to be sorted is not: decide it whole at the end, if nothing was
        released yet (the first page shows a server that does not sort); else stop."""
        if self.chosen:
            raise InitializerError(
                f"the listing gave {path!r} after {self._last!r}, out of key order, after "
                "fetching had begun; rerun (a server that never sorts is decided at the end)"
            )
        log.info("the listing is not sorted by key: files are chosen once it is complete")
        self.order, self._seen, self._held = Order.UNKNOWN, 0, []

    def _take_all(self) -> Iterator[list[int]]:
        """Order.UNKNOWN, listing complete: every folder first, then every file."""
        self._add_folders(path for _, path in self.listed.paths() if self._allowed(path))
        self.filtered_count, self.filtered_out = 0, []  # counted again below
        batch: list[tuple[int, str]] = []
        for seq, path in self.listed.paths():
            if self._allowed(path):
                batch.append((seq, path))
            if len(batch) >= BATCH:
                yield self._release(batch)
                batch = []
        if batch:
            yield self._release(batch)

    def _release(self, batch: list[tuple[int, str]]) -> list[int]:
        released = self._without_conflicts(batch)
        self.chosen += len(released)
        return released

    def _add_folders(self, paths: Iterable[str]) -> None:
        """Every folder of ``paths``: the names no file may have."""
        last = ""
        batch: list[tuple[str]] = []
        for path in paths:
            folder = path.rpartition("/")[0]
            if folder == last:  # files of one folder mostly come together: its ancestors are in
                continue
            last = folder
            while folder:
                batch.append((folder,))
                folder = folder.rpartition("/")[0]
            if len(batch) >= BATCH:
                self._insert_folders(batch)
                batch.clear()
        self._insert_folders(batch)

    def _insert_folders(self, batch: list[tuple[str]]) -> None:
        self.listed.db.executemany(f"INSERT OR IGNORE INTO {self._folders} VALUES (?)", batch)

    def _without_conflicts(self, rows: list[tuple[int, str]]) -> list[int]:
        """The rows whose path is no other path's folder; the others are logged."""
        if not rows:
            return []
        found = {
            path
            for (path,) in self.listed.db.execute(
                f"SELECT path FROM {self._folders} WHERE path IN (SELECT value FROM json_each(?))",
                (_json_list(path for _, path in rows),),
            )
        }
        for path in sorted(found):
            log.warning("skipped %r: another key uses it as a folder", path)
            self.conflicts.append(path)
        return [seq for seq, path in rows if path not in found]

    def _report_skipped(self) -> None:
        skipped = self.listing.skipped
        for name, why in skipped[self._skipped_seen :]:
            log.warning("skipped %r: the name %s", name, why)
        self._skipped_seen = len(skipped)

    def report(self) -> None:
        """Once the listing is complete: what the patterns left out; NotFoundError when no file
        is left to fetch."""
        self._report_skipped()
        if self.repeated:
            log.warning(
                "the listing gave %d key(s) twice in a row (pages that overlap): each was "
                "fetched once",
                self.repeated,
            )
        if self.filtered_count:
            shown = ", ".join(self.filtered_out)
            more = self.filtered_count - len(self.filtered_out)
            log.info(
                "%d file(s) left out by the allow/ignore patterns: %s%s",
                self.filtered_count,
                shown,
                f" and {more} more" if more else "",
            )
        if self.chosen:
            return
        if not self.listed and self.listing.skipped:
            raise NotFoundError(
                f"all {len(self.listing.skipped)} name(s) under {self.where} were skipped as "
                "unsafe (see the warnings above); nothing to fetch — rename those objects"
            )
        raise NotFoundError(
            f"none of the {len(self.listed)} file(s) under {self.where} match the allow/ignore "
            "patterns; adjust ALLOW_PATTERNS / IGNORE_PATTERNS"
        )


def _json_list(values: Iterable[str]) -> str:
    return json.dumps(list(values))

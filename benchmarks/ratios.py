"""Per-round ratios of paired runs (:mod:`benchmarks.schedule`): the peer's time over ours.

A ratio above 1 means ours was faster in that round. A scenario's figure for a peer is the
median of its rounds' ratios, with their range (min-max) and how many rounds gave one: a round
gives a ratio only when both of its runs passed their check.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass

from benchmarks.schedule import ANCHOR


@dataclass(frozen=True)
class PairedRatio:
    """The median of a peer's per-round ratios, their range and how many there were."""

    median: float
    low: float
    high: float
    rounds: int


def per_round(records: Iterable[dict], peer: str, anchor: str = ANCHOR) -> list[float]:
    """``peer`` wall time / ``anchor`` wall time, for each round of their pairs, in round order.

    ``records`` are one scenario's run records (``harness.RunRecord`` as dicts).
    """
    pairs: dict[int, dict[str, dict]] = {}
    for rec in records:
        if rec.get("pair") == peer and rec["contender"] in (peer, anchor):
            pairs.setdefault(rec["run"], {})[rec["contender"]] = rec
    out = []
    for _round, pair in sorted(pairs.items()):
        ours, theirs = pair.get(anchor), pair.get(peer)
        if ours and theirs and ours["ok"] and theirs["ok"] and ours["wall_s"] > 0:
            out.append(theirs["wall_s"] / ours["wall_s"])
    return out


def summarize(ratios: list[float]) -> PairedRatio | None:
    if not ratios:
        return None
    return PairedRatio(statistics.median(ratios), min(ratios), max(ratios), len(ratios))


def paired_ratio(records: Iterable[dict], peer: str, anchor: str = ANCHOR) -> PairedRatio | None:
    """The figure of ``peer`` against ``anchor`` in one scenario; None without a full pair."""
    return summarize(per_round(records, peer, anchor))

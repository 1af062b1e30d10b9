"""The order of a scenario's runs: paired rounds, ours against one peer at a time.

Timings on this VM depend on what ran just before (a contender that frees 900 MiB makes the next
one slower), so a ratio is fair only between two runs back to back. Each round pairs ours with
every other contender in turn, the two runs of a pair adjacent. Which of the two goes first
alternates from round to round for every peer (and from pair to pair within a round), and the
peers' order rotates from round to round, so no contender always follows the same one.

Without ours among the contenders, with ours alone, and for the rerun scenarios (whose figures
are absolute, not ratios), every contender runs once per round, interleaved (A B C, B C A, ...).
The sharding scenario's variants (K = 1, 2, 4 shards) run forwards and backwards in turn
(A B C, C B A, ...), so each K is as often early as late in a round.
"""

from __future__ import annotations

from dataclasses import dataclass

ANCHOR = "ours"
# Scenario kinds whose figures are ratios, run in pairs; the others (reruns) are interleaved.
PAIRED_KINDS = ("cold", "latency", "durable")
# The durable kind pairs ours in its durable mode with the disk's floor (dd of the same bytes).
ANCHORS = {"durable": "ours-durable"}
# The many-files asset (100,000 small objects) and its one scenario: no target, opt-in.
MANY_FILES = "files"
MANY_FILES_SCENARIO = f"cold-s3-{MANY_FILES}"


def parts(scenario: str) -> tuple[str, str, str]:
    """(kind, source, asset) of a scenario name; the kind may hold a dash (second-trainjob)."""
    kind, source, asset = scenario.rsplit("-", 2)
    return kind, source, asset


def anchor_of(kind: str) -> str:
    """The contender a kind's ratios are taken against."""
    return ANCHORS.get(kind, ANCHOR)


@dataclass(frozen=True)
class Slot:
    """One run to make: in which round, of which contender, as part of which pair."""

    round: int
    contender: str
    pair: str | None = None  # the peer of the pair this run belongs to; None outside pairs


def interleaved(names: list[str], rounds: int) -> list[Slot]:
    """Every contender once per round, the order rotated by one each round."""
    out: list[Slot] = []
    for r in range(rounds):
        shift = r % len(names) if names else 0
        out += [Slot(r, name) for name in names[shift:] + names[:shift]]
    return out


def paired(names: list[str], rounds: int, anchor: str = ANCHOR) -> list[Slot]:
    """Rounds of (anchor, peer) pairs back to back, each pair's order alternating by round."""
    peers = [n for n in names if n != anchor]
    if anchor not in names or not peers:
        return interleaved(names, rounds)
    out: list[Slot] = []
    for r in range(rounds):
        shift = r % len(peers)
        for peer in peers[shift:] + peers[:shift]:
            anchor_first = (r + peers.index(peer)) % 2 == 0
            order = (anchor, peer) if anchor_first else (peer, anchor)
            out += [Slot(r, name, pair=peer) for name in order]
    return out


def alternating(names: list[str], rounds: int) -> list[Slot]:
    """Every name once per round, in order on even rounds and reversed on odd ones."""
    out: list[Slot] = []
    for r in range(rounds):
        order = names if r % 2 == 0 else names[::-1]
        out += [Slot(r, name) for name in order]
    return out

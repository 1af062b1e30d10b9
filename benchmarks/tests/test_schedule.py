"""Paired rounds: the order of the runs, and the per-round ratio maths the report is built on."""

from __future__ import annotations

import pytest

from benchmarks import ratios, schedule
from benchmarks.schedule import Slot

PEERS = ["s5cmd", "aws-cli", "boto3"]


def _pairs(slots: list[Slot]) -> list[tuple[Slot, Slot]]:
    assert len(slots) % 2 == 0
    return [(slots[i], slots[i + 1]) for i in range(0, len(slots), 2)]


def test_every_round_pairs_ours_with_each_peer_back_to_back() -> None:
    slots = schedule.paired(["ours", *PEERS], rounds=5)
    assert len(slots) == 5 * len(PEERS) * 2
    for first, second in _pairs(slots):
        assert first.round == second.round
        assert first.pair == second.pair
        assert {first.contender, second.contender} == {"ours", first.pair}
    for r in range(5):
        assert sorted(s.pair for s in slots if s.round == r and s.contender == "ours") == sorted(
            PEERS
        )


def test_which_side_goes_first_alternates_from_round_to_round_for_every_peer() -> None:
    slots = schedule.paired(["ours", *PEERS], rounds=6)
    for peer in PEERS:
        firsts = [a.contender for a, _b in _pairs(slots) if a.pair == peer]
        assert firsts == ["ours", peer] * 3 or firsts == [peer, "ours"] * 3


def test_consecutive_pairs_in_a_round_start_with_different_sides() -> None:
    slots = schedule.paired(["ours", *PEERS], rounds=1)
    firsts = [a.contender == "ours" for a, _b in _pairs(slots)]
    assert firsts == [True, False, True]


def test_the_peers_order_rotates_from_round_to_round() -> None:
    slots = schedule.paired(["ours", *PEERS], rounds=3)
    orders = [[a.pair for a, _b in _pairs(slots) if a.round == r] for r in range(3)]
    assert orders == [PEERS, PEERS[1:] + PEERS[:1], PEERS[2:] + PEERS[:2]]


@pytest.mark.parametrize("names", [PEERS, ["ours"]])
def test_without_ours_and_a_peer_every_contender_runs_once_per_round_interleaved(
    names: list[str],
) -> None:
    slots = schedule.paired(names, rounds=3)
    assert all(s.pair is None for s in slots)
    by_round = [[s.contender for s in slots if s.round == r] for r in range(3)]
    assert by_round[0] == names
    assert by_round[1] == names[1:] + names[:1]


def _rec(contender: str, rnd: int, wall: float, pair: str | None, ok: bool = True) -> dict:
    return {"contender": contender, "run": rnd, "wall_s": wall, "pair": pair, "ok": ok}


def test_a_round_ratio_is_the_peer_time_over_ours_in_the_same_pair() -> None:
    records = [
        _rec("ours", 0, 2.0, "s5cmd"), _rec("s5cmd", 0, 3.0, "s5cmd"),
        _rec("ours", 0, 10.0, "boto3"), _rec("boto3", 0, 5.0, "boto3"),
        _rec("s5cmd", 1, 1.0, "s5cmd"), _rec("ours", 1, 4.0, "s5cmd"),
    ]  # fmt: skip
    assert ratios.per_round(records, "s5cmd") == [1.5, 0.25]
    assert ratios.per_round(records, "boto3") == [0.5]


def test_the_figure_is_the_median_of_the_round_ratios_with_their_range() -> None:
    walls = [(2.0, 2.2), (2.0, 3.0), (1.0, 0.9), (2.0, 2.4), (1.0, 5.0)]  # ours, peer
    records = [
        rec
        for r, (ours, peer) in enumerate(walls)
        for rec in (_rec("ours", r, ours, "s5cmd"), _rec("s5cmd", r, peer, "s5cmd"))
    ]
    got = ratios.paired_ratio(records, "s5cmd")
    assert got is not None
    assert got.rounds == 5
    assert got.median == pytest.approx(1.2)  # of 1.1, 1.5, 0.9, 1.2, 5.0
    assert (got.low, got.high) == (pytest.approx(0.9), pytest.approx(5.0))


def test_a_round_with_a_failed_run_gives_no_ratio() -> None:
    records = [
        _rec("ours", 0, 2.0, "s5cmd"), _rec("s5cmd", 0, 4.0, "s5cmd"),
        _rec("ours", 1, 2.0, "s5cmd", ok=False), _rec("s5cmd", 1, 9.0, "s5cmd"),
        _rec("ours", 2, 2.0, "s5cmd"),  # its peer's run is missing (interrupted session)
    ]  # fmt: skip
    got = ratios.paired_ratio(records, "s5cmd")
    assert got == ratios.PairedRatio(2.0, 2.0, 2.0, 1)


def test_unpaired_records_give_no_ratio() -> None:
    records = [_rec("ours", 0, 2.0, None), _rec("s5cmd", 0, 4.0, None)]
    assert ratios.paired_ratio(records, "s5cmd") is None

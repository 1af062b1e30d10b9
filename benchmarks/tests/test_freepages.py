"""The session holds back free page reporting and leaves the machine as it found it."""

from __future__ import annotations

from pathlib import Path

from benchmarks.freepages import HIGHEST_ORDER, as_found, reporting_held_back


def test_reporting_order_is_raised_for_the_session_and_put_back(tmp_path: Path) -> None:
    parameter = tmp_path / "page_reporting_order"
    parameter.write_text("9\n")
    with reporting_held_back(parameter) as done:
        assert parameter.read_text().strip() == str(HIGHEST_ORDER)
        assert done.endswith(f"order {HIGHEST_ORDER} for the session (order 9 before)")
    assert parameter.read_text().strip() == "9"


def test_order_is_put_back_when_the_session_fails(tmp_path: Path) -> None:
    parameter = tmp_path / "page_reporting_order"
    parameter.write_text("9\n")
    try:
        with reporting_held_back(parameter):
            raise RuntimeError("a scenario failed")
    except RuntimeError:
        pass
    assert parameter.read_text().strip() == "9"


def test_a_machine_without_reporting_is_left_alone_and_said_so(tmp_path: Path) -> None:
    with reporting_held_back(tmp_path / "absent") as done:
        assert done == "not reported to the host (no page_reporting module)"
    assert not (tmp_path / "absent").exists()


def test_an_order_already_at_the_highest_is_not_rewritten(tmp_path: Path) -> None:
    parameter = tmp_path / "page_reporting_order"
    parameter.write_text(f"{HIGHEST_ORDER}\n")
    with reporting_held_back(parameter) as done:
        assert done == f"reported to the host in blocks of order {HIGHEST_ORDER}, as found"
    assert parameter.read_text() == f"{HIGHEST_ORDER}\n"


def test_by_default_the_kernel_is_measured_as_found_and_the_line_says_how(tmp_path: Path) -> None:
    parameter = tmp_path / "page_reporting_order"
    parameter.write_text("9\n")
    with as_found(parameter) as done:
        assert parameter.read_text() == "9\n"
    assert done == "reported to the host in blocks of order 9, as found"
    with as_found(tmp_path / "absent") as done:
        assert done == "not reported to the host (no page_reporting module)"

"""docs/s3-compatibility.md shows exactly the matrix the tests assert (no server needed, so
these run in the default test run; the matrix itself is marked ``s3compat``)."""

from __future__ import annotations

from pathlib import Path

from tests.compat import matrix
from tests.compat.test_matrix import UPLOADS

DOC = Path(__file__).resolve().parents[2] / "docs" / "s3-compatibility.md"


def test_the_doc_shows_the_matrix_the_tests_assert():
    assert matrix.generated_block(DOC.read_text()) == matrix.render(), (
        "docs/s3-compatibility.md is out of date: "
        "python -m tests.compat.matrix --write docs/s3-compatibility.md"
    )


def test_every_server_has_an_expectation_in_every_fetch_case():
    for case in matrix.FETCH_CASES:
        assert set(case.expect) == set(matrix.SERVERS), case.name
    for case in matrix.TAMPER_CASES:
        assert set(case.expect) <= set(matrix.SERVERS), case.name


def test_every_fetch_case_has_an_upload():
    assert set(UPLOADS) == {case.name for case in matrix.FETCH_CASES}


def test_the_requirements_pin_the_versions_the_matrix_records():
    pins = (Path(__file__).parent / "requirements.txt").read_text()
    for server in matrix.SERVERS:
        assert f"{matrix.PACKAGES[server]}=={matrix.VERSIONS[server][-1]}" in pins.replace(
            "[server]", ""
        ), server

"""The command line keeps its promises: every flag, env name and default of contract.json."""

from __future__ import annotations

import json

import pytest

from tests.contract.snapshot import CONTRACT, snapshot

PROMISED = json.loads(CONTRACT.read_text())
NOW = snapshot()


@pytest.mark.parametrize("prog", sorted(PROMISED))
def test_every_flag_keeps_its_env_names(prog):
    assert NOW[prog]["flags"] == PROMISED[prog]["flags"]


@pytest.mark.parametrize("prog", sorted(PROMISED))
def test_every_environment_only_setting_keeps_its_names(prog):
    assert sorted(NOW[prog]["environment only"]) == sorted(PROMISED[prog]["environment only"])


@pytest.mark.parametrize("prog", sorted(PROMISED))
def test_every_default_is_unchanged(prog):
    assert NOW[prog]["defaults"] == PROMISED[prog]["defaults"]


@pytest.mark.parametrize("prog", sorted(PROMISED))
def test_the_exit_codes_in_help_are_unchanged(prog):
    assert NOW[prog]["exit codes"] == PROMISED[prog]["exit codes"]

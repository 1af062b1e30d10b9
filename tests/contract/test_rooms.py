"""The engine stays a few small rooms: sizes and imports that keep each module to its one job."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "initializers"
MODULES = sorted(PACKAGE.rglob("*.py"))
LONGEST_FUNCTION = 60  # lines, decorators and docstring included


def _imports(module: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(module.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


@pytest.mark.parametrize("module", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_function_is_longer_than_a_screen(module):
    too_long = [
        f"{node.name}: {node.end_lineno - node.lineno + 1} lines"
        for node in ast.walk(ast.parse(module.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno - node.lineno + 1 > LONGEST_FUNCTION
    ]
    assert too_long == []


def test_the_engine_is_the_hall_between_the_rooms_not_a_room_of_everything():
    assert len((PACKAGE / "engine.py").read_text().splitlines()) <= 300


@pytest.mark.parametrize("module", ["engine.py", "transport.py", "planning.py", "scheduling.py"])
def test_the_byte_path_never_reads_settings(module):
    """The settings are the CLI's: the engine is told its workers, and tells the source."""
    assert "initializers.config" not in _imports(PACKAGE / module)


def test_nothing_but_the_environment_module_reads_the_environment():
    readers = [
        str(m.relative_to(PACKAGE))
        for m in MODULES
        if m.name != "environment.py"
        and ("os.environ" in m.read_text() or "getenv" in m.read_text())
    ]
    assert readers == []

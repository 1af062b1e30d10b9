"""Allow/ignore globs on paths relative to the storage URI.

Semantics follow huggingface_hub's ``filter_repo_objects`` so users get what they know from
``hf download``: ``fnmatch`` on the whole relative path (``*`` also crosses ``/``), and a pattern
ending in ``/`` means everything under that folder.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from fnmatch import fnmatchcase

from initializers.errors import UsageError


def parse_patterns(raw: str, what: str) -> tuple[str, ...]:
    """Split a comma-separated list of globs, refusing ones that cannot mean what was meant."""
    patterns = tuple(p.strip() for p in raw.split(",") if p.strip())
    if not patterns:
        raise UsageError(f"the {what} patterns {raw!r} hold no pattern; use e.g. '*.json,*.txt'")
    for pattern in patterns:
        if _has_unclosed_bracket(pattern):
            raise UsageError(
                f"{what} pattern {pattern!r} has an unclosed '['; close it or escape it as '[[]'"
            )
        if pattern.startswith("/"):
            raise UsageError(
                f"{what} pattern {pattern!r} starts with '/'; patterns match paths relative to "
                "the storage URI, so drop the leading '/'"
            )
    return patterns


def _has_unclosed_bracket(pattern: str) -> bool:
    # fnmatch silently treats an unclosed '[' as a literal; that is never what a user meant.
    stripped = re.sub(r"\[!?\]?[^\]]*\]", "", pattern)
    return "[" in stripped


def _expand(pattern: str) -> str:
    return pattern + "*" if pattern.endswith("/") else pattern


def matches_any(path: str, patterns: Iterable[str]) -> bool:
    return any(fnmatchcase(path, _expand(p)) for p in patterns)


def is_selected(path: str, allow: tuple[str, ...], ignore: tuple[str, ...]) -> bool:
    """True when ``path`` passes the allow list (empty allows all) and no ignore pattern."""
    if allow and not matches_any(path, allow):
        return False
    return not (ignore and matches_any(path, ignore))

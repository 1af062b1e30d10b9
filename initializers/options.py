"""Option rows, and everything derived from them: parsing, ``--help``, secrets, the docs table.

An option is declared once, by its owner (:mod:`initializers.config` for the common ones, each
source beside its module for its own), as an :class:`Option` row in an :class:`OptionGroup`. The
row says its flag, the env vars that may carry it (the Kubeflow names first, then the
ecosystem's), how to parse it, its default, whether it is a secret; nothing else repeats any of
that. Flags win over the environment; an empty env var counts as unset.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from initializers.errors import UsageError

if TYPE_CHECKING:
    from initializers.retry import RetryPolicy


@dataclass(frozen=True)
class Option:
    """One setting: where it is read from, how it is parsed, what it defaults to."""

    dest: str
    flag: str | None  # None: environment only (credentials never take a flag)
    env: tuple[str, ...]
    help: str
    parse: Callable[[str], Any] = str
    default: Any = None
    shown: str = ""  # the default as the docs show it, where that is not the value itself
    secret: bool = False  # never echoed: not in a message, a log line or a repr
    switch: bool = False  # a flag without a value
    locates: bool = False  # says where the asset lives (an endpoint): part of its store key

    def default_text(self) -> str:
        """The default as ``--help`` and the docs show it; "" when there is nothing to show."""
        if self.shown or self.default in (None, "", ()):
            return self.shown
        if self.switch:
            return "off"
        value = self.default
        return f"{value:g}" if isinstance(value, float) else str(value)


@dataclass(frozen=True)
class OptionGroup:
    """The options one owner declares: the common ones (``owner`` ""), or one scheme's."""

    owner: str  # the scheme whose source alone receives these; "" for every source
    title: str  # how the docs head the group
    rows: tuple[Option, ...]
    # After parsing: derived values and checks across rows (read a secret file, refuse a pair
    # given half). It may replace values in place; it raises UsageError naming the fix.
    finish: Callable[[dict[str, Any]], None] | None = None
    library_env: tuple[tuple[str, str], ...] = ()  # (names, help) read by a library, not by us


# -- parsers: each raises ValueError with the reason, which resolve() turns into one line --------
# (booleans: initializers.environment.parse_bool, shared with the shims)


def positive_int(value: str) -> int:
    number = int(value)
    if number < 1:
        raise ValueError("must be at least 1")
    return number


def non_negative_int(value: str) -> int:
    number = int(value)
    if number < 0:
        raise ValueError("must be 0 or more")
    return number


def positive_float(value: str) -> float:
    number = float(value)
    if number <= 0:
        raise ValueError("must be greater than 0")
    return number


def one_of(*choices: str) -> Callable[[str], str]:
    def parse(value: str) -> str:
        if value not in choices:
            raise ValueError("must be " + " or ".join(f"'{c}'" for c in choices))
        return value

    return parse


def read_secret_file(path: Path, what: str) -> str:
    """The stripped content of a file holding a secret, or a UsageError naming the file."""
    try:
        value = path.read_text().strip()
    except OSError as exc:
        raise UsageError(f"cannot read the {what} file {path}: {exc.strerror}") from None
    if not value:
        raise UsageError(f"the {what} file {path} is empty")
    return value


# -- values ---------------------------------------------------------------------------------------


class Values(Mapping[str, Any]):
    """Resolved options, read as attributes; a secret's value is never in the repr."""

    def __init__(self, values: Mapping[str, Any], secret: Iterable[str] = ()) -> None:
        self._values = dict(values)
        self._secret = frozenset(secret)

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["_values"][name]
        except KeyError:
            raise AttributeError(f"{name!r} is not among these options") from None

    def __getitem__(self, name: str) -> Any:
        return self._values[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        shown = (f"{k}={'…' if k in self._secret else repr(v)}" for k, v in self._values.items())
        return f"{type(self).__name__}({', '.join(shown)})"

    def secrets(self) -> list[str]:
        """Values that must never appear in any output (a secret mapping's values too)."""
        found = []
        for name in self._secret:
            value = self._values.get(name)
            if isinstance(value, tuple):  # header pairs: the values are the secrets
                found += [v for _, v in value if v]
            elif value:
                found.append(str(value))
        return found


class SourceSettings(Values):
    """What one source is given: the common options, its own, the run's one retry policy and
    how many requests the engine keeps in flight (its connection pools' size)."""

    def __init__(
        self,
        values: Mapping[str, Any],
        secret: Iterable[str],
        retry: RetryPolicy,
        connections: int,
    ) -> None:
        super().__init__(values, secret)
        self.__dict__["retry"] = retry
        self.__dict__["connections"] = connections


# -- reading flags and environment ------------------------------------------------------------


def resolve(option: Option, flags: argparse.Namespace, env: Mapping[str, str]) -> Any:
    """The flag's value if given, else the first non-empty env var's, parsed; else the default."""
    raw: Any = getattr(flags, option.dest, None)
    source = option.flag
    if raw is True:  # a switch given on the command line
        return True
    if raw is None:
        for name in option.env:
            if env.get(name, "").strip():
                raw, source = env[name].strip(), name
                break
    if raw is None:
        return option.default
    try:
        return option.parse(raw)
    except ValueError as exc:
        shown = "…" if option.secret else raw
        raise UsageError(f"invalid {source}={shown!r}: {exc}") from None


def add_flags(
    parser: argparse.ArgumentParser, rows: Iterable[Option], defaults: Mapping[str, str]
) -> None:
    """A flag for every row that has one; ``defaults`` overrides a row's shown default."""
    for option in rows:
        if option.flag is None:
            continue
        shown = defaults.get(option.dest) or option.default_text()
        note = (f" (default: {shown})" if shown else "") + f" [env: {', '.join(option.env)}]"
        extra: dict[str, Any] = {"action": "store_true"} if option.switch else {}
        parser.add_argument(
            option.flag, dest=option.dest, default=None, help=option.help + note, **extra
        )


# -- the docs table ---------------------------------------------------------------------------


def markdown_table(group: OptionGroup, defaults: Mapping[str, str]) -> str:
    """A group's options as a markdown table: flag, environment, default, meaning."""
    lines = ["| flag | environment | default | meaning |", "|---|---|---|---|"]
    for option in group.rows:
        flag = f"`{option.flag}`" if option.flag else ""
        env = ", ".join(f"`{name}`" for name in option.env)
        shown = defaults.get(option.dest) or option.default_text()
        lines.append(f"| {flag} | {env} | {_cell(shown)} | {_cell(option.help)} |")
    for names, text in group.library_env:
        env = ", ".join(f"`{name}`" for name in names.split(", "))
        lines.append(f"| | {env} | | {_cell(text)} (read by the client libraries) |")
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")

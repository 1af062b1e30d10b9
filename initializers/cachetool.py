"""``initializer-cache``: list the shared asset store's entries and prune them.

Runnable by hand or as a Kubernetes CronJob on the cache volume. Prune never removes an entry an
initializer holds (it is fetching into it or linking it), and takes the least recently used first.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

from initializers.cache import AssetCache, EntryInfo, to_prune
from initializers.environment import variables
from initializers.errors import ExitCode, InitializerError, UsageError
from initializers.progress import human_bytes

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGTP]?)(i?B?)\s*$", re.IGNORECASE)
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$", re.IGNORECASE)
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_size(text: str) -> int:
    """``500GiB``, ``500G``, ``1.5TiB``, ``1000`` (bytes): powers of 1024, as ``df -h`` shows."""
    match = _SIZE.match(text)
    if not match:
        raise ValueError(f"expected a size such as 500GiB, got {text!r}")
    number, unit = float(match[1]), match[2].upper()
    return int(number * 1024 ** " KMGTP".index(unit or " "))


def parse_duration(text: str) -> float:
    """``7d``, ``12h``, ``30m``, ``90s``, ``2w`` in seconds."""
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"expected a duration such as 7d, 12h or 30m, got {text!r}")
    return float(match[1]) * _SECONDS[match[2].lower()]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="initializer-cache",
        description="List or prune the shared asset store that --cache-dir / CACHE_DIR names.",
        epilog="Exit codes: 0 ok, 2 usage, 6 the cache folder cannot be read or written.",
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=variables().get("CACHE_DIR") or None,
        help="the cache folder [env: CACHE_DIR]",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    ls = commands.add_parser("ls", help="show entries: size, files, last use, state, source")
    ls.add_argument("--json", action="store_true", help="one JSON object per line")
    prune = commands.add_parser(
        "prune", help="remove least recently used entries that no initializer holds"
    )
    prune.add_argument("--max-size", help="remove entries until the rest fit, e.g. 500GiB")
    prune.add_argument("--older-than", help="remove entries unused for this long, e.g. 7d")
    prune.add_argument("--dry-run", action="store_true", help="say what would go; remove nothing")
    return parser


def _ago(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit} ago"
    return f"{seconds:.0f}s ago"


def _state(entry: EntryInfo) -> str:
    if entry.held_by:
        return "in use"
    return "complete" if entry.complete else "incomplete"


def _list(cache: AssetCache, as_json: bool) -> None:
    now = time.time()
    entries = cache.entries()
    if as_json:
        for e in entries:
            print(json.dumps({**e.__dict__, "state": _state(e)}, sort_keys=True))
        return
    print(f"{'SIZE':>10}  {'FILES':>6}  {'LAST USED':>10}  {'STATE':<10}  SOURCE / ENTRY")
    for e in entries:
        print(
            f"{human_bytes(e.size):>10}  {e.files:>6}  {_ago(now - e.last_used):>10}  "
            f"{_state(e):<10}  {e.source}  {e.name}"
        )
    total = sum(e.size for e in entries)
    noun = "entry" if len(entries) == 1 else "entries"
    print(f"{len(entries)} {noun}, {human_bytes(total)} in {cache.root}")


def _prune(cache: AssetCache, args: argparse.Namespace) -> None:
    try:
        max_size = parse_size(args.max_size) if args.max_size else None
        older_than = parse_duration(args.older_than) if args.older_than else None
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if max_size is None and older_than is None:
        raise UsageError("say what to prune: --max-size SIZE and/or --older-than DURATION")
    cache.empty_trash()
    entries = cache.entries()
    held = [e for e in entries if e.held_by]
    removed = 0
    for entry in to_prune(entries, max_size, older_than, time.time()):
        if args.dry_run:
            print(f"would remove {entry.name} ({human_bytes(entry.size)}, {entry.source})")
        elif cache.remove(entry.name):  # False: an initializer took it since the listing
            print(f"removed {entry.name} ({human_bytes(entry.size)}, {entry.source})")
            removed += entry.size
        else:
            print(f"kept {entry.name}: an initializer or a training started using it")
    for entry in held:
        print(f"kept {entry.name}: {entry.held_by} holds it")
    if not args.dry_run:
        left = sum(e.size for e in entries) - removed
        print(f"freed {human_bytes(removed)}; {human_bytes(left)} left in {cache.root}")


def run(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    prog = "initializer-cache"
    try:
        if args.cache_dir is None:
            raise UsageError("no cache folder: pass --cache-dir or set CACHE_DIR")
        if not args.cache_dir.is_dir():
            raise UsageError(f"{args.cache_dir} is not a folder; check --cache-dir / CACHE_DIR")
        cache = AssetCache(args.cache_dir)
        if args.command == "ls":
            _list(cache, args.json)
        else:
            _prune(cache, args)
        return ExitCode.OK
    except InitializerError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return int(exc.exit_code)
    except OSError as exc:
        print(f"{prog}: error: {args.cache_dir}: {exc.strerror or exc}", file=sys.stderr)
        return int(ExitCode.LOCAL_STORAGE)


def main() -> None:
    sys.exit(run())

"""What the initializers' command line promises, read from the parser and the settings: the
flags, the env names each takes, the environment-only names, and the defaults. The spec beside
it compares this with ``contract.json``, written before the settings redesign, so no flag, env
name or default can change by accident. ``python -m tests.contract.snapshot --write`` rewrites
it, for a deliberate change only."""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from initializers import dataset, model
from initializers.config import build_parser, load_settings

CONTRACT = Path(__file__).with_name("contract.json")
_ENV = re.compile(r"\[env: ([^\]]+)\]")
_ENV_ONLY_NAME = re.compile(r"^  ([A-Z][A-Z0-9_]*(?:, [A-Z][A-Z0-9_]*)*)$")


def _flags(parser: argparse.ArgumentParser) -> dict[str, list[str]]:
    found = {}
    for action in parser._actions:
        if not action.option_strings or action.dest == "help":
            continue
        env = _ENV.search(" ".join((action.help or "").split()))
        found[action.option_strings[0]] = env.group(1).split(", ") if env else []
    return found


def _env_only(parser: argparse.ArgumentParser) -> list[list[str]]:
    lines = (parser.epilog or "").splitlines()
    return [m.group(1).split(", ") for line in lines if (m := _ENV_ONLY_NAME.match(line))]


def _defaults(kind: Any) -> dict[str, str]:
    settings = load_settings(kind.DEFAULTS, [], {"STORAGE_URI": "s3://bucket/prefix"})
    names = [
        "output",
        "allow_patterns",
        "ignore_patterns",
        "patterns_are_default",
        "fallback_weights",
        "workers",
        "region",
        "anonymous",
        "cache_dir",
        "shards",
        "shard_index",
        "shard_run",
        "log_format",
        "progress_interval",
        "timeout",
        "retries",
        "termination_log",
        "debug",
        "revision",
        "endpoint",
        "hf_endpoint",
        "role_arn",
        "ca_bundle",
        "http_headers",
        "azure_authority",
    ]
    return {name: repr(getattr(settings, name)) for name in names}


def snapshot() -> dict[str, Any]:
    contract: dict[str, Any] = {}
    for kind in (dataset, model):
        parser = build_parser(kind.DEFAULTS)
        contract[parser.prog] = {
            "flags": _flags(parser),
            "environment only": _env_only(parser),
            "defaults": _defaults(kind),
            "exit codes": re.search(r"Exit codes: [^.]+\.", " ".join(parser.epilog.split()))[0],
        }
    return contract


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        CONTRACT.write_text(json.dumps(snapshot(), indent=1) + "\n")
    else:
        print(json.dumps(snapshot(), indent=1))

"""The arguments every Hub driver script takes (``contenders._hub_script`` passes them)."""

from __future__ import annotations

import argparse


def parse_hub_args(description: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--repo", required=True)
    parser.add_argument("--repo-type", default="model")
    parser.add_argument("--dest", required=True)
    parser.add_argument("--allow", action="append")
    parser.add_argument("--ignore", action="append")
    return parser.parse_args()

"""The arguments every S3 driver script takes (``contenders.S3ClientScript`` passes them)."""

from __future__ import annotations

import argparse


def parse_s3_args(description: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--bucket", required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--dest", required=True)
    parser.add_argument("--exclude", action="append", default=[])
    return parser.parse_args()

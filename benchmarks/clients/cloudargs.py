"""The arguments the gs:// and az:// driver scripts take (``contenders.CloudSdkScript``)."""

from __future__ import annotations

import argparse


def parse_cloud_args(description: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--bucket", required=True, help="the GCS bucket or the Azure container")
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--dest", required=True)
    parser.add_argument("--exclude", action="append", default=[])
    return parser.parse_args()

"""oras-py's pull of an artifact into a folder: ``OrasClient(insecure=True).pull(...)``.

Its defaults otherwise: each layer becomes the file its ``org.opencontainers.image.title``
annotation names; blobs come one after another, each one GET streamed to disk in 8 KiB reads,
and no digest is checked. It pulls artifacts only: an image's layers (a modelcar) have no title,
so it would write each tar under its digest's name, unextracted.
"""

from __future__ import annotations

import argparse
import sys

from oras.client import OrasClient


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--target", required=True, help="HOST/REPO:TAG")
    parser.add_argument("--dest", required=True)
    args = parser.parse_args()
    OrasClient(insecure=True).pull(target=args.target, outdir=args.dest)
    return 0


if __name__ == "__main__":
    sys.exit(main())

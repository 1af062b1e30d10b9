"""huggingface_hub's ``snapshot_download`` into a folder, with its defaults (8 workers).

This is also what the Kubeflow Trainer's Hugging Face initializers call.
"""

from __future__ import annotations

import sys

from hubargs import parse_hub_args  # the script's folder is on sys.path
from huggingface_hub import snapshot_download


def main() -> int:
    args = parse_hub_args(__doc__.split("\n", 1)[0])
    snapshot_download(
        repo_id=args.repo,
        repo_type=args.repo_type,
        local_dir=args.dest,
        allow_patterns=args.allow,
        ignore_patterns=args.ignore,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

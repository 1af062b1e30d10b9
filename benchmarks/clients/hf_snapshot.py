"""huggingface_hub's ``snapshot_download`` into a folder, with its defaults (8 workers).

This is also what the Kubeflow Trainer's Hugging Face initializers call.
"""

from __future__ import annotations

import argparse
import sys

from huggingface_hub import snapshot_download


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repo", required=True)
    parser.add_argument("--repo-type", default="model")
    parser.add_argument("--dest", required=True)
    parser.add_argument("--allow", action="append")
    parser.add_argument("--ignore", action="append")
    args = parser.parse_args()
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

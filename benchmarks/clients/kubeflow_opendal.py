"""The Kubeflow Trainer S3 initializer's approach, re-implemented minimally and faithfully.

Upstream (``pkg/initializers/utils/opendal.py``): an OpenDAL S3 operator with a retry layer, list
the prefix recursively, then for each object, one at a time, ``op.read(key)`` (the whole object in
memory) and write it out. Only the filter differs: upstream matches ``endswith`` on its ignore
list; here the benchmark's shared exclude globs, so every contender fetches the same files.
"""

from __future__ import annotations

import fnmatch
import os
import sys
from pathlib import Path

import opendal
from s3args import parse_s3_args  # the script's folder is on sys.path


def main() -> int:
    args = parse_s3_args(__doc__)
    op = opendal.Operator(
        "s3",
        root="/",
        bucket=args.bucket,
        endpoint=args.endpoint,
        access_key_id=os.environ["AWS_ACCESS_KEY_ID"],
        secret_access_key=os.environ["AWS_SECRET_ACCESS_KEY"],
        region="auto",
    ).layer(opendal.layers.RetryLayer(max_times=3, factor=2.0, jitter=True))
    prefix = args.prefix.rstrip("/") + "/"
    destination = Path(args.dest)
    destination.mkdir(parents=True, exist_ok=True)
    for entry in op.list(prefix, recursive=True):
        if entry.metadata.is_dir:
            continue
        key = entry.path
        rel = key[len(prefix) :].lstrip("/")
        if any(fnmatch.fnmatch(rel, p) for p in args.exclude):
            continue
        target = destination / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        data = op.read(key)
        with open(target, "wb") as f:
            f.write(data)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""boto3's TransferManager with its default config: list the prefix, queue every object, wait.

What a user of boto3 writes to copy a prefix (``create_transfer_manager`` picks the classic
threaded manager here; 10 threads, 8 MiB parts).
"""

from __future__ import annotations

import fnmatch
import os
import sys

import boto3
from boto3.s3.transfer import TransferConfig, create_transfer_manager
from s3args import parse_s3_args  # the script's folder is on sys.path


def main() -> int:
    args = parse_s3_args(__doc__)
    client = boto3.client("s3", endpoint_url=args.endpoint, region_name="us-east-1")
    prefix = args.prefix.rstrip("/") + "/"
    keys = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=args.bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            rel = obj["Key"][len(prefix) :]
            if not any(fnmatch.fnmatch(rel, p) for p in args.exclude):
                keys.append((obj["Key"], rel))
    with create_transfer_manager(client, TransferConfig()) as manager:
        futures = []
        for key, rel in keys:
            target = os.path.join(args.dest, rel)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            futures.append(manager.download(args.bucket, key, target))
        for future in futures:
            future.result()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""google-cloud-storage's transfer manager, as its docs show for a folder of objects.

``Client()`` (``STORAGE_EMULATOR_HOST`` points it at the emulator, anonymously, as it does ours),
``list_blobs`` under the prefix, then ``transfer_manager.download_many_to_path`` with its
defaults: 8 worker processes (``worker_type=PROCESS``), one whole-object download per blob, each
checked against the object's crc32c (``checksum="auto"``, google-crc32c's C extension).
"""

from __future__ import annotations

import fnmatch
import sys

from cloudargs import parse_cloud_args  # the script's folder is on sys.path
from google.cloud import storage
from google.cloud.storage import transfer_manager


def main() -> int:
    args = parse_cloud_args(__doc__)
    client = storage.Client()
    bucket = client.bucket(args.bucket)
    prefix = args.prefix.rstrip("/") + "/"
    names = []
    for blob in client.list_blobs(args.bucket, prefix=prefix):
        rel = blob.name[len(prefix) :]
        if not any(fnmatch.fnmatch(rel, p) for p in args.exclude):
            names.append(rel)
    transfer_manager.download_many_to_path(
        bucket, names, destination_directory=args.dest, blob_name_prefix=prefix,
        raise_exception=True,
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

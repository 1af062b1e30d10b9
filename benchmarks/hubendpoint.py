"""The Hub endpoint of the benchmark: the project's test Hub for the API, nginx for LFS bytes.

``tests/servers/hub.py`` (``HubServer``) answers repo info, tree listings and ``resolve``, and
redirects LFS files to a CDN. Here its CDN URLs point at nginx instead of its own Python CDN
listener: nginx serves ``/lfs/<sha256>`` from a folder of symlinks to the fixture files (the
signed-URL query is not checked there). The Hub listener runs in this process of its own, so the
harness's measuring loop never shares a GIL with it.

Run: ``python -m benchmarks.hubendpoint --fixture DIR --cdn-url URL --lfs-dir DIR --ready FILE``;
it writes ``{"endpoint": ...}`` to FILE once every repo is published, then serves until SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
MODEL_REPO = "bench/model"
DATASET_REPO = "bench/dataset"
# Binary files must be LFS on the real Hub; text (.jsonl, .json, .md) stays in git below 10 MiB.
EXTRA_LFS = ("*.png",)


def nginx_cdn_location(lfs_dir: Path) -> str:
    """The nginx ``location`` that stands in for the Hub's CDN (ETag = the file's sha256)."""
    return f"""
        location ~ "^/lfs/([0-9a-f]{{64}})$" {{
            alias {lfs_dir}/$1;
            etag off;
            add_header ETag '"$1"';
        }}"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--fixture", type=Path, required=True, help="fixture root (index.json)")
    parser.add_argument("--cdn-url", required=True, help="base URL of nginx's /lfs/ location")
    parser.add_argument("--lfs-dir", type=Path, required=True)
    parser.add_argument("--ready", type=Path, required=True)
    args = parser.parse_args(argv)

    sys.path.insert(0, str(REPO_ROOT))
    from tests.servers.hub import DEFAULT_LFS_PATTERNS, HubServer

    objects = json.loads((args.fixture / "index.json").read_text())["objects"]
    data = args.fixture / "s3" / "bench"

    def files(asset: str) -> dict[str, Path]:
        prefix = asset + "/"
        return {k[len(prefix) :]: data / k for k in objects if k.startswith(prefix)}

    # LFS redirects go to nginx (serving lfs_files()) rather than the Hub's own CDN listener.
    hub = HubServer(lfs_patterns=(*DEFAULT_LFS_PATTERNS, *EXTRA_LFS), cdn_origin=args.cdn_url)
    hub.start()
    hub.add_repo(MODEL_REPO, files("model"))
    hub.add_repo(DATASET_REPO, files("dataset"), repo_type="dataset")
    args.lfs_dir.mkdir(parents=True, exist_ok=True)
    for sha256, path in hub.lfs_files().items():
        link = args.lfs_dir / sha256
        if not link.is_symlink():
            os.symlink(path, link)
    args.ready.write_text(json.dumps({"endpoint": hub.endpoint}))

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    while not stop.wait(0.5):
        pass
    hub.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

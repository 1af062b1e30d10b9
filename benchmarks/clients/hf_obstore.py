"""The naive Hub download a user would write: HfApi lists the repo, obstore fetches the files.

``HfApi.list_repo_tree`` (recursive), the allow/ignore filter ``snapshot_download`` applies, then
every file's ``resolve`` URL through obstore's ``HTTPStore`` (Rust ``object_store``; it follows
the Hub's 302 to the CDN) on asyncio, up to 64 requests in flight, each body streamed into its
file. No verification, no fsync, no resume.
"""

from __future__ import annotations

import asyncio
import os
import sys

import obstore
from hubargs import parse_hub_args  # the script's folder is on sys.path
from huggingface_hub import HfApi, constants
from huggingface_hub.hf_api import RepoFile
from huggingface_hub.utils import filter_repo_objects
from obstore.store import HTTPStore

IN_FLIGHT = 64


async def fetch_all(store: HTTPStore, paths: list[str], dest: str) -> None:
    limit = asyncio.Semaphore(IN_FLIGHT)

    async def fetch(path: str) -> None:
        target = os.path.join(dest, path)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        async with limit:
            result = await obstore.get_async(store, path)
            with open(target, "wb") as f:
                async for chunk in result.stream(min_chunk_size=1 << 20):
                    f.write(chunk)

    await asyncio.gather(*(fetch(p) for p in paths))


def main() -> int:
    args = parse_hub_args(__doc__.split("\n", 1)[0])
    tree = HfApi().list_repo_tree(args.repo, repo_type=args.repo_type, recursive=True)
    files = [entry.path for entry in tree if isinstance(entry, RepoFile)]
    paths = list(filter_repo_objects(files, allow_patterns=args.allow, ignore_patterns=args.ignore))
    kind = "datasets/" if args.repo_type == "dataset" else ""
    url = f"{constants.ENDPOINT}/{kind}{args.repo}/resolve/main"
    store = HTTPStore.from_url(url, client_options={"allow_http": True})
    asyncio.run(fetch_all(store, paths, args.dest))
    sys.stdout.flush()
    sys.stderr.flush()
    # obstore 0.12.1 can abort in interpreter teardown (a runtime thread takes the GIL again):
    # everything is written and closed here, so leave without that teardown.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())

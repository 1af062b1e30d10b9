"""Check a contender's output tree: exactly the expected files, right sizes, right bytes.

Files up to 4 MiB are compared whole with the source; larger ones in five 1 MiB windows (start,
end and three seeded offsets), which catches a misplaced or missing part without re-reading
gigabytes after every run. Clients' own bookkeeping (``.cache/huggingface/``, the initializer's
manifest and lock, a cache entry's record, the sharded runs' per-shard locks) is allowed;
anything else extra — a leftover ``.part`` file, a skipped file that was fetched, a shard plan
left behind — is an error. ``check_manifest`` checks ours' manifest itself: one, listing exactly
the expected files and sizes (the sharded runs write it once, from the last shard to finish).
"""

from __future__ import annotations

import json
import os
import random
import re
from pathlib import Path

from benchmarks.fixtures import Fixture

MiB = 1 << 20
WHOLE_LIMIT = 4 * MiB
ALLOWED_EXTRA_PREFIXES = (".cache/huggingface/",)
MANIFEST = ".initializer-manifest.json"
ALLOWED_EXTRA = {MANIFEST, ".initializer.lock", ".initializer-cache.json"}
ALLOWED_EXTRA_PATTERN = re.compile(r"\.initializer-shard-\d+\.lock")


def _files(dest: Path) -> dict[str, int]:
    out = {}
    for root, _dirs, names in os.walk(dest):
        for name in names:
            path = Path(root, name)
            if path.is_file() and not path.is_symlink():
                out[path.relative_to(dest).as_posix()] = path.stat().st_size
    return out


def _windows(size: int, rel: str) -> list[int]:
    rng = random.Random(rel)
    offsets = {0, max(0, size - MiB)} | {rng.randrange(0, max(1, size - MiB)) for _ in range(3)}
    return sorted(offsets)


def _same(a: Path, b: Path, size: int, rel: str) -> bool:
    with open(a, "rb") as fa, open(b, "rb") as fb:
        if size <= WHOLE_LIMIT:
            return fa.read() == fb.read()
        for offset in _windows(size, rel):
            if os.pread(fa.fileno(), MiB, offset) != os.pread(fb.fileno(), MiB, offset):
                return False
    return True


def check(dest: Path, fixture: Fixture, asset: str) -> list[str]:
    """Problems with ``dest`` as a copy of ``asset``; empty when it is right."""
    expected = fixture.expected(asset)
    found = _files(dest) if dest.is_dir() else {}
    problems = []
    missing = sorted(set(expected) - set(found))
    if missing:
        problems.append(f"{len(missing)} missing file(s) (e.g. {missing[0]})")
    extra = sorted(
        rel
        for rel in set(found) - set(expected)
        if rel not in ALLOWED_EXTRA
        and not rel.startswith(ALLOWED_EXTRA_PREFIXES)
        and not ALLOWED_EXTRA_PATTERN.fullmatch(rel)
    )
    if extra:
        problems.append(f"{len(extra)} unexpected file(s) (e.g. {extra[0]})")
    for rel, obj in sorted(expected.items()):
        if rel not in found:
            continue
        if found[rel] != obj.size:
            problems.append(f"{rel}: {found[rel]} bytes, expected {obj.size}")
        elif not _same(dest / rel, fixture.source_path(f"{asset}/{rel}"), obj.size, rel):
            problems.append(f"{rel}: content differs from the source")
        if len(problems) > 5:
            break
    return problems


def check_manifest(dest: Path, fixture: Fixture, asset: str) -> list[str]:
    """Problems with ours' manifest in ``dest``: missing, unreadable, or not exactly the
    expected files with their sizes."""
    path = dest / MANIFEST
    try:
        files = json.loads(path.read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return [f"no readable manifest ({type(exc).__name__}: {exc})"]
    expected = {rel: o.size for rel, o in fixture.expected(asset).items()}
    listed = {rel: entry.get("size") for rel, entry in files.items()}
    if listed == expected:
        return []
    missing, extra = set(expected) - set(listed), set(listed) - set(expected)
    wrong = sorted(rel for rel in set(expected) & set(listed) if expected[rel] != listed[rel])
    return [
        f"manifest: {len(missing)} file(s) missing, {len(extra)} extra, {len(wrong)} of the "
        "wrong size"
    ]

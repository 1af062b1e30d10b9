"""Check a contender's output tree: exactly the expected files, right sizes, right bytes.

Files up to 4 MiB are compared whole with the source; larger ones in five 1 MiB windows (start,
end and three seeded offsets), which catches a misplaced or missing part without re-reading
gigabytes after every run. Clients' own bookkeeping (``.cache/huggingface/``, the initializer's
manifest and lock) is allowed; anything else extra — a leftover ``.part`` file, a skipped file
that was fetched — is an error.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

from benchmarks.fixtures import Fixture

MiB = 1 << 20
WHOLE_LIMIT = 4 * MiB
ALLOWED_EXTRA_PREFIXES = (".cache/huggingface/",)
ALLOWED_EXTRA = {".initializer-manifest.json", ".initializer.lock"}


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
        if rel not in ALLOWED_EXTRA and not rel.startswith(ALLOWED_EXTRA_PREFIXES)
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

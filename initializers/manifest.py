"""The completion manifest: one JSON file at the root of a destination, written last.

Its presence means "this folder holds a complete copy of <source> at <revision>". A rerun reads it
to skip what is already in place, and the launcher shims read it to know the assets are ready.
Each entry records the size and mtime we left the file with, so a local edit or truncation is
noticed without re-hashing gigabytes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from initializers.fsutil import atomic_write_bytes

MANIFEST_NAME = ".initializer-manifest.json"
FORMAT_VERSION = 1
LINES_PER_PIECE = 1024  # the manifest is written this many files' lines at a time


@dataclass(frozen=True, slots=True)
class FileRecord:
    """What we know of one committed file."""

    size: int
    checksum: str | None  # "<algorithm>:<hex or base64>", e.g. "sha256:ab12...", or None
    version: str | None  # the source's version token (ETag, blob id) used to detect changes
    mtime_ns: int

    def to_dict(self) -> dict[str, object]:
        """The JSON form (dataclasses.asdict deep-copies; this runs once per file per write)."""
        return {
            "size": self.size,
            "checksum": self.checksum,
            "version": self.version,
            "mtime_ns": self.mtime_ns,
        }


@dataclass
class Manifest:
    """A complete destination: where it came from and every file in it."""

    source: str
    revision: str | None
    files: dict[str, FileRecord] = field(default_factory=dict)
    format: int = FORMAT_VERSION

    def json_pieces(self) -> Iterator[bytes]:
        """The JSON text in pieces, one file's record per line, sorted by path (``grep`` finds
        a file's line): the whole text of 100,000 files is never held at once (~20 MiB, three
        times over as it was built). By the C encoder: ``indent`` takes the pure-Python one,
        0.42 s against 0.24 s for 100,000 files, after the last byte of a run."""
        head = json.dumps({"format": self.format, "source": self.source, "revision": self.revision})
        encode = json.JSONEncoder().encode
        paths = sorted(self.files)
        if not paths:
            yield f'{head[:-1]}, "files": {{}}}}\n'.encode()
            return
        yield f'{head[:-1]}, "files": {{\n'.encode()
        for first in range(0, len(paths), LINES_PER_PIECE):
            batch = paths[first : first + LINES_PER_PIECE]
            lines = [f"{encode(path)}: {encode(self.files[path].to_dict())}" for path in batch]
            last = first + LINES_PER_PIECE >= len(paths)
            yield (",\n".join(lines) + ("\n}}\n" if last else ",\n")).encode()

    def total_bytes(self) -> int:
        return sum(rec.size for rec in self.files.values())


def manifest_path(dest: Path) -> Path:
    return dest / MANIFEST_NAME


def read_manifest(dest: Path) -> Manifest | None:
    """The manifest of ``dest``, or None when it is absent or not one we can trust."""
    return read_manifest_file(manifest_path(dest))


def read_manifest_file(path: Path) -> Manifest | None:
    """A manifest (or a shard's record, which has the same form) at ``path``, or None."""
    try:
        body = json.loads(path.read_bytes())
        if body.get("format") != FORMAT_VERSION:
            return None
        files = {path: FileRecord(**rec) for path, rec in body["files"].items()}
        return Manifest(source=body["source"], revision=body.get("revision"), files=files)
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def write_manifest(dest: Path, manifest: Manifest) -> None:
    """Write the manifest atomically; the caller has already made every file durable."""
    write_manifest_file(manifest_path(dest), manifest)


def write_manifest_file(path: Path, manifest: Manifest) -> None:
    atomic_write_bytes(path, manifest.json_pieces())


def remove_manifest(dest: Path) -> None:
    """Mark ``dest`` incomplete before touching any file a previous run committed."""
    manifest_path(dest).unlink(missing_ok=True)


def record_is_intact(dest: Path, relpath: str, record: FileRecord) -> bool:
    """True when the file is still the one we committed (same size and mtime)."""
    try:
        st = os.stat(dest / relpath, follow_symlinks=False)
    except OSError:
        return False
    return st.st_size == record.size and st.st_mtime_ns == record.mtime_ns


def find_problems(dest: Path) -> list[str]:
    """Why ``dest`` is not a complete initializer output (empty list when it is).

    Used by the launcher shims before they start training.
    """
    if dest.is_symlink() and not dest.exists():
        return [
            f"{dest} links to {os.readlink(dest)}, which is not there: mount the cache volume "
            "(CACHE_DIR) at the same path in this pod as in the initializers"
        ]
    manifest = read_manifest(dest)
    if manifest is None:
        return [f"{manifest_path(dest)} is missing or unreadable (initializer not finished)"]
    return [
        f"{dest / path} changed or missing since the initializer finished"
        for path, record in manifest.files.items()
        if not record_is_intact(dest, path, record)
    ]

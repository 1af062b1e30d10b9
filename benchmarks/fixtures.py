"""Generate the benchmark's model and dataset on disk, once per scale, with S3-shaped metadata.

Layout under ``.bench/fixtures/scale-<s>/``: ``s3/<bucket>/model/...`` and
``s3/<bucket>/dataset/...`` (the folder nginx serves) and ``index.json`` (every object's size,
MD5, and what S3 keeps for an object a current AWS SDK or CLI uploaded (botocore >= 1.36 sends
CRC32 by default), with 8 MiB parts from 8 MiB up:

- the ETag: plain MD5 for a single-part object, ``"<md5 of part md5s>-N"`` for a multipart one;
- the CRC32 additional checksum: ``FULL_OBJECT`` (base64 of the big-endian CRC32 of the whole
  object) for a single-part object, ``COMPOSITE`` (base64 of the CRC32 of the parts' CRC32
  digests, then ``-N``) for a multipart one.

``files`` is a third prefix, for the many-files scenario only: 100,000 objects of 1-8 KiB (at
scale 1) in 200 folders, an image-folder dataset whose time and memory go to per-file costs.

The model holds what a Hugging Face repo holds: safetensors shards and configs that the model
initializer's default patterns fetch, plus files those defaults skip (``.bin``, ``.h5``,
``.msgpack``, ``.pth``, README, .gitattributes). Every contender is asked to fetch the same set.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import zlib
from dataclasses import asdict, dataclass
from fnmatch import fnmatchcase
from pathlib import Path

import numpy as np

MiB = 1 << 20
KiB = 1 << 10
BUCKET = "bench"
FORMAT = 5  # 4: CRC32 checksums; 5: the files prefix
MULTIPART_THRESHOLD = 8 * MiB  # aws s3 cp / s3transfer defaults
MULTIPART_CHUNK = 8 * MiB
FIXED_MTIME = 1_735_689_600  # 2025-01-01T00:00:00Z: stable Last-Modified across regenerations

# The model initializer's defaults (docs/CLI-CONTRACT.md); the fixture checks it agrees with them.
MODEL_ALLOW = (
    "*.json", "*.safetensors", "*.model", "*.txt", "*.gguf", "*.tiktoken", "tokenizer*",
)  # fmt: skip
MODEL_IGNORE = ("*.msgpack", "*.h5", "*.bin", "*.pt", "*.pth")
# What the other contenders are told to leave out of the model prefix: the same set, as excludes.
MODEL_EXCLUDES = ("*.msgpack", "*.h5", "*.bin", "*.pt", "*.pth", "*.md", "*.gitattributes")


@dataclass(frozen=True)
class ObjectInfo:
    """One object of the fixture, as the S3 listing reports it."""

    key: str
    size: int
    md5: str
    etag: str  # with the quotes, as S3 sends it
    checksum_crc32: str  # x-amz-checksum-crc32: base64, with "-N" when COMPOSITE
    checksum_type: str  # x-amz-checksum-type: "FULL_OBJECT" or "COMPOSITE"


@dataclass
class Fixture:
    """A generated fixture: where it lives and what each asset must contain."""

    root: Path
    scale: float
    objects: dict[str, ObjectInfo]

    @property
    def data_root(self) -> Path:
        """The folder nginx serves: ``<data_root>/<bucket>/<key>``."""
        return self.root / "s3"

    def source_path(self, key: str) -> Path:
        return self.data_root / BUCKET / key

    def listing(self, asset: str) -> dict[str, ObjectInfo]:
        """Every object under the asset's prefix, by path relative to it."""
        prefix = asset + "/"
        return {k[len(prefix) :]: o for k, o in self.objects.items() if k.startswith(prefix)}

    def expected(self, asset: str) -> dict[str, ObjectInfo]:
        """What a correct fetch of ``asset`` ("model" or "dataset") leaves in the destination."""
        files = self.listing(asset)
        if asset == "model":
            return {rel: o for rel, o in files.items() if model_selects(rel)}
        return files

    def expected_bytes(self, asset: str) -> int:
        return sum(o.size for o in self.expected(asset).values())


def model_selects(rel: str) -> bool:
    """The model initializer's default allow/ignore rule (fnmatch on the relative path)."""
    allowed = any(fnmatchcase(rel, p) for p in MODEL_ALLOW)
    return allowed and not any(fnmatchcase(rel, p) for p in MODEL_IGNORE)


def excluded_by_excludes(rel: str) -> bool:
    """The exclude-list form of the same rule, which the other contenders are given."""
    name = rel.rsplit("/", 1)[-1]
    return any(fnmatchcase(rel, p) or fnmatchcase(name, p) for p in MODEL_EXCLUDES)


def _model_files(scale: float) -> list[tuple[str, int]]:
    shard = max(MiB, int(256 * MiB * scale))
    # Odd sizes, a little over 256 MiB each, so no shard is a whole number of parts or pages.
    files = [(f"model-{i:05d}-of-00008.safetensors", shard + 4099 * i + 17) for i in range(1, 9)]
    files += [
        ("model.safetensors.index.json", 24 * KiB),
        ("config.json", 1 * KiB + 300),
        ("generation_config.json", 200),
        ("tokenizer.json", 2 * MiB + 12345),
        ("tokenizer_config.json", 50 * KiB),
        ("special_tokens_map.json", 500),
        ("tokenizer.model", 500 * KiB),
        ("merges.txt", 450 * KiB),
        # Skipped by the model defaults: other frameworks' weights, docs, git metadata.
        ("pytorch_model.bin", max(KiB, int(32 * MiB * scale)) + 3),
        ("tf_model.h5", max(KiB, int(16 * MiB * scale)) + 5),
        ("flax_model.msgpack", max(KiB, int(16 * MiB * scale)) + 7),
        ("original/consolidated.00.pth", max(KiB, int(32 * MiB * scale)) + 9),
        ("README.md", 5 * KiB),
        (".gitattributes", 1500),
    ]
    return files


def _dataset_files(scale: float) -> list[tuple[str, int]]:
    count = max(16, round(2000 * scale))
    rng = np.random.default_rng(2000)
    sizes = rng.integers(64 * KiB, MiB + 1, size=count)
    exts = ("parquet", "jsonl", "arrow", "png")
    files = [("README.md", 3 * KiB), ("dataset_info.json", 2 * KiB)]
    for i, size in enumerate(sizes.tolist()):
        split = "train" if i % 10 < 8 else ("validation" if i % 10 == 8 else "test")
        files.append((f"data/{split}/shard-{i // 50:03d}/{i:06d}.{exts[i % 4]}", int(size)))
    return files


def _many_files(scale: float) -> list[tuple[str, int]]:
    count = max(64, round(100_000 * scale))
    sizes = np.random.default_rng(100_000).integers(KiB, 8 * KiB + 1, size=count)
    return [(f"images/class-{i // 500:03d}/{i:06d}.jpg", int(s)) for i, s in enumerate(sizes)]


def _b64_crc32(crc: int) -> str:
    return base64.b64encode(crc.to_bytes(4, "big")).decode()


def _write_object(path: Path, size: int, seed: int) -> tuple[str, str, str, str]:
    """Write ``size`` seeded random bytes; return (md5 hex, ETag with quotes, CRC32, its type).

    The file is written beside its final name and renamed over it, so a server reading the old
    file (identical bytes, as the seeds are fixed) never sees it truncated.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    whole = hashlib.md5()
    whole_crc = 0
    part_md5s: list[bytes] = []
    part_crcs: list[bytes] = []
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        remaining = size
        while remaining:
            n = min(MULTIPART_CHUNK, remaining)
            block = rng.bytes(n)
            f.write(block)
            whole.update(block)
            whole_crc = zlib.crc32(block, whole_crc)
            part_md5s.append(hashlib.md5(block).digest())
            part_crcs.append(zlib.crc32(block).to_bytes(4, "big"))
            remaining -= n
    os.utime(tmp, (FIXED_MTIME, FIXED_MTIME))
    os.replace(tmp, path)
    if size >= MULTIPART_THRESHOLD:
        n = len(part_md5s)
        etag = f'"{hashlib.md5(b"".join(part_md5s)).hexdigest()}-{n}"'
        crc32 = f"{_b64_crc32(zlib.crc32(b''.join(part_crcs)))}-{n}"
        return whole.hexdigest(), etag, crc32, "COMPOSITE"
    return whole.hexdigest(), f'"{whole.hexdigest()}"', _b64_crc32(whole_crc), "FULL_OBJECT"


def fixture_dir(bench_dir: Path, scale: float) -> Path:
    return bench_dir / "fixtures" / f"scale-{scale:g}"


def load_or_generate(bench_dir: Path, scale: float, log=print) -> Fixture:
    """The fixture for ``scale``, generating it (a few seconds per GiB) when missing or stale."""
    root = fixture_dir(bench_dir, scale).resolve()
    index = root / "index.json"
    if index.exists():
        body = json.loads(index.read_text())
        if body.get("format") == FORMAT:
            objects = {k: ObjectInfo(**v) for k, v in body["objects"].items()}
            return Fixture(root, scale, objects)
    log(f"generating fixtures at scale {scale:g} under {root} ...")
    objects: dict[str, ObjectInfo] = {}
    seed = 0
    assets = (
        ("model", _model_files(scale)),
        ("dataset", _dataset_files(scale)),
        ("files", _many_files(scale)),
    )
    for asset, files in assets:
        for rel, size in files:
            seed += 1
            key = f"{asset}/{rel}"
            written = _write_object(root / "s3" / BUCKET / key, size, seed)
            objects[key] = ObjectInfo(key, size, *written)
    fixture = Fixture(root, scale, objects)
    _check_model_rules(fixture)
    tmp = index.with_name(".index.json.tmp")
    tmp.write_text(
        json.dumps(
            {
                "format": FORMAT,
                "scale": scale,
                "objects": {k: asdict(o) for k, o in objects.items()},
            }
        )
    )
    os.replace(tmp, index)
    return fixture


def _check_model_rules(fixture: Fixture) -> None:
    """The include rule (ours) and the exclude rule (everyone else's) must pick the same files."""
    for rel in fixture.listing("model"):
        if model_selects(rel) == excluded_by_excludes(rel):
            raise RuntimeError(f"fixture: model defaults and excludes disagree on {rel}")

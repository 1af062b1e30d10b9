"""Digests the sources announce, computed over a finished file.

Hex digests (``md5``, ``sha1``, ``sha256``, ``git-sha1``) are what ETags and the Hub's oids
carry; the S3 additional checksums (``s3-crc32``, ``s3-crc32c``, ``s3-sha1``, ``s3-sha256``,
``s3-crc64nvme``) are base64 of the big-endian digest, as S3 returns them. CRC32C and CRC64NVME
need awscrt; without it they are reported unsupported and only the size is verified.
"""

from __future__ import annotations

import base64
import hashlib
import os
import zlib
from collections.abc import Callable
from typing import Protocol

READ_SIZE = 4 << 20


class Digest(Protocol):
    def update(self, data: bytes, /) -> None: ...
    def finish(self) -> str: ...


class _Hashlib:
    def __init__(self, name: str, b64: bool) -> None:
        self._hash = hashlib.new(name)
        self._b64 = b64

    def update(self, data: bytes) -> None:
        self._hash.update(data)

    def finish(self) -> str:
        if self._b64:
            return base64.b64encode(self._hash.digest()).decode()
        return self._hash.hexdigest()


class _Crc:
    def __init__(self, step: Callable[[bytes, int], int], width: int) -> None:
        self._step = step
        self._value = 0
        self._width = width

    def update(self, data: bytes) -> None:
        self._value = self._step(data, self._value)

    def finish(self) -> str:
        return base64.b64encode(self._value.to_bytes(self._width, "big")).decode()


def _crt_step(name: str) -> Callable[[bytes, int], int] | None:
    try:
        from awscrt import checksums
    except ImportError:
        return None
    return getattr(checksums, name, None)


class _GitBlob(_Hashlib):
    """Git's blob id: sha1 of ``blob <size>\\0`` + content (the Hub's oid of non-LFS files)."""

    def __init__(self, size: int) -> None:
        super().__init__("sha1", b64=False)
        self.update(b"blob %d\0" % size)


def _factory(algorithm: str, size: int = 0) -> Callable[[], Digest] | None:
    if algorithm in ("md5", "sha1", "sha256"):
        return lambda: _Hashlib(algorithm, b64=False)
    if algorithm == "git-sha1":
        return lambda: _GitBlob(size)
    if algorithm in ("s3-sha1", "s3-sha256"):
        return lambda: _Hashlib(algorithm.removeprefix("s3-"), b64=True)
    if algorithm == "s3-crc32":
        return lambda: _Crc(zlib.crc32, 4)
    crt = {"s3-crc32c": ("crc32c", 4), "s3-crc64nvme": ("crc64nvme", 8)}.get(algorithm)
    if crt and (step := _crt_step(crt[0])):
        return lambda: _Crc(step, crt[1])
    return None


def is_supported(algorithm: str) -> bool:
    return _factory(algorithm) is not None


def new_digest(algorithm: str, size: int) -> Digest:
    """A running digest for a ``size``-byte content, fed in order with ``update``."""
    factory = _factory(algorithm, size)
    if factory is None:
        raise ValueError(f"unsupported checksum algorithm {algorithm!r}")
    return factory()


def digest_file(fd: int, size: int, algorithm: str) -> str:
    """Digest of the first ``size`` bytes of the open file ``fd``."""
    digest = new_digest(algorithm, size)
    offset = 0
    while offset < size:
        block = os.pread(fd, min(READ_SIZE, size - offset), offset)
        if not block:
            break
        digest.update(block)
        offset += len(block)
    return digest.finish()

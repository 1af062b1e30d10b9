"""Digests the sources announce, computed while a file streams in or from its bytes on disk.

Hex digests (``md5``, ``sha1``, ``sha256``, ``git-sha1``) are what ETags and the Hub's oids
carry (``sha384`` and ``sha512`` too, for what an https:// URL pins); the S3 additional
checksums (``s3-crc32``, ``s3-crc32c``, ``s3-sha1``, ``s3-sha256``, ``s3-crc64nvme``) are
base64 of the big-endian digest, as S3 returns them; ``crc32c`` (GCS's) and ``md5-base64``
(GCS's ``md5Hash``, Azure's ``Content-MD5``) are encoded the same way. CRC32C and CRC64NVME need
awscrt; without it they are reported unsupported and only the size is verified.

A digest of an upload's parts (``parts``: their sizes, in order) is S3's for a multipart object:
each part digested on its own, then the digest of their binary digests, followed by ``-N``: the
ETag's ``<md5 of the parts' md5s>-N`` and a ``COMPOSITE`` additional checksum alike.

Where a source announces several digests of one file (a GCS object's crc32c and md5Hash), they
are one checksum to the engine, verified all at once in the same pass over the bytes: the
algorithms joined by ``+`` (``crc32c+md5-base64``), the values by ``,`` in the same order
(base64 and hex have no comma). It matches only when every digest does. :func:`all_of` builds
one.
"""

from __future__ import annotations

import base64
import hashlib
import os
import threading
from collections.abc import Callable, Sequence
from typing import Protocol

from isal import isal_zlib  # ISA-L's CRC-32: ~22 GiB/s here against zlib's ~3 (see pyproject)

READ_SIZE = 4 << 20
HEX_HASHES = ("md5", "sha1", "sha256", "sha384", "sha512")  # hashlib names, hex digests


class Digest(Protocol):
    def update(self, data: bytes, /) -> None: ...
    def finish(self) -> str: ...


class _Hashlib:
    def __init__(self, name: str, b64: bool) -> None:
        self._hash = hashlib.new(name)
        self._b64 = b64

    def update(self, data: bytes) -> None:
        self._hash.update(data)

    def raw(self) -> bytes:
        return self._hash.digest()

    def finish(self) -> str:
        if self._b64:
            return base64.b64encode(self._hash.digest()).decode()
        return self._hash.hexdigest()


class Crc:
    """A running CRC of ``step`` (``crc = step(data, crc)``), ``width`` bytes wide."""

    def __init__(self, step: Callable[[bytes, int], int], width: int) -> None:
        self._step = step
        self.value = 0
        self._width = width

    def update(self, data: bytes) -> None:
        self.value = self._step(data, self.value)

    def raw(self) -> bytes:
        return self.value.to_bytes(self._width, "big")

    def finish(self) -> str:
        return base64.b64encode(self.raw()).decode()


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


class _AllOf:
    """Several digests of the same bytes, fed together; ``finish`` gives their values joined."""

    def __init__(self, digests: list[Digest]) -> None:
        self._digests = digests

    def update(self, data: bytes) -> None:
        for digest in self._digests:
            digest.update(data)

    def finish(self) -> str:
        return VALUES.join(digest.finish() for digest in self._digests)


class _Parts:
    """The digest of a multipart object's parts (sizes ``sizes``): each part's digest, raw,
    fed to one more digest of the same kind, whose value gets ``-N``."""

    def __init__(self, make: Callable[[], Digest], sizes: Sequence[int]) -> None:
        self._make = make
        self._sizes = sizes
        self._index = 0
        self._left = sizes[0]
        self._part = make()
        self._of_parts = make()

    def update(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            last = self._index == len(self._sizes) - 1
            take = len(view) if last else min(len(view), self._left)
            self._part.update(view[:take])
            self._left -= take
            view = view[take:]
            if self._left <= 0 and not last:
                self._next_part()

    def _next_part(self) -> None:
        self._of_parts.update(self._part.raw())  # type: ignore[attr-defined]
        self._index += 1
        self._left = self._sizes[self._index]
        self._part = self._make()

    def finish(self) -> str:
        while self._index < len(self._sizes) - 1:  # parts never fed (the caller checks sizes)
            self._next_part()
        self._of_parts.update(self._part.raw())  # type: ignore[attr-defined]
        return f"{self._of_parts.finish()}-{len(self._sizes)}"


ALGORITHMS = "+"  # joins the algorithms of digests verified together
VALUES = ","  # joins their values, in the same order


def all_of(digests: Sequence[tuple[str, str]]) -> tuple[str, str]:
    """The (algorithm, value) that verifies every ``(algorithm, value)`` of ``digests``."""
    return (
        ALGORITHMS.join(algorithm for algorithm, _ in digests),
        VALUES.join(value for _, value in digests),
    )


# algorithm -> (awscrt.checksums function, width in bytes)
_CRT_CHECKSUMS = {
    "s3-crc32c": ("crc32c", 4),
    "crc32c": ("crc32c", 4),
    "s3-crc64nvme": ("crc64nvme", 8),
}


def _factory(algorithm: str, size: int = 0) -> Callable[[], Digest] | None:
    if ALGORITHMS in algorithm:
        parts = [_factory(part, size) for part in algorithm.split(ALGORITHMS)]
        made = [part for part in parts if part is not None]
        if len(made) < len(parts):
            return None  # one cannot be computed here: a source offers only the ones that can
        return lambda: _AllOf([make() for make in made])
    if algorithm in HEX_HASHES:
        return lambda: _Hashlib(algorithm, b64=False)
    if algorithm == "git-sha1":
        return lambda: _GitBlob(size)
    if algorithm in ("s3-sha1", "s3-sha256", "md5-base64"):
        name = algorithm.removeprefix("s3-").removesuffix("-base64")
        return lambda: _Hashlib(name, b64=True)
    if algorithm == "s3-crc32":
        return lambda: Crc(isal_zlib.crc32, 4)
    crt = _CRT_CHECKSUMS.get(algorithm)
    if crt and (step := _crt_step(crt[0])):
        return lambda: Crc(step, crt[1])
    return None


def is_supported(algorithm: str) -> bool:
    return _factory(algorithm) is not None


def new_digest(algorithm: str, size: int, parts: Sequence[int] = ()) -> Digest:
    """A running digest for a ``size``-byte content, fed in order with ``update``; of its
    ``parts`` (their sizes) when given."""
    factory = _factory(algorithm, size)
    if factory is None:
        raise ValueError(f"unsupported checksum algorithm {algorithm!r}")
    return _Parts(factory, parts) if parts else factory()


def digest_file(fd: int, size: int, algorithm: str, parts: Sequence[int] = ()) -> str:
    """Digest of the first ``size`` bytes of the open file ``fd`` (of its ``parts``, if given)."""
    digest = new_digest(algorithm, size, parts)
    feed(digest, fd, 0, size)
    return digest.finish()


_buffers = threading.local()


def feed(digest: Digest, fd: int, start: int, end: int) -> int:
    """Feed bytes ``[start, end)`` of ``fd`` to ``digest``; return where reading stopped.

    Reads go into one reused buffer per thread: a fresh 4 MiB block per read left each worker
    thread's malloc arena holding its own blocks (+50 MiB peak RSS on the Hub model, measured).
    """
    buffer = getattr(_buffers, "view", None)
    if buffer is None:
        buffer = _buffers.view = memoryview(bytearray(READ_SIZE))
    offset = start
    while offset < end:
        count = os.preadv(fd, [buffer[: min(READ_SIZE, end - offset)]], offset)
        if not count:
            break
        digest.update(buffer[:count])
        offset += count
    return offset


class SpanDigest:
    """The digest of a file whose spans land out of order (parallel ranged GETs).

    A chunk that lands exactly where the digest has got to is digested as it streams
    (:meth:`offer`); any other finished span is read back from the page cache as soon as every
    byte before it is digested, by whichever worker finished it, while the other spans still
    download — so the digest is ready moments after the last byte lands instead of after one
    more pass over the whole file. hashlib and pread release the GIL, so this runs beside the
    transfers.
    """

    def __init__(self, algorithm: str, size: int, parts: Sequence[int] = ()) -> None:
        self._digest = new_digest(algorithm, size, parts)
        self._size = size
        self._hashed = 0  # bytes [0, _hashed) are digested
        self._ready: dict[int, int] = {}  # finished spans not digested yet: start -> end
        self._lock = threading.Lock()  # guards _ready and _hashed
        self._reader = threading.Lock()  # one thread digests at a time, in order

    def offer(self, chunk: memoryview, offset: int) -> None:
        """Digest ``chunk``, just written at ``offset``, if it is next in order and no other
        thread is digesting; otherwise its span is read back once reported done."""
        if self._hashed != offset or not self._reader.acquire(blocking=False):
            return
        try:
            if self._hashed == offset:
                self._digest.update(chunk)
                with self._lock:
                    self._hashed += len(chunk)
        finally:
            self._reader.release()

    def span_done(self, fd: int, start: int, end: int) -> None:
        """Note ``[start, end)`` is on disk; digest what now follows on, unless another
        thread is digesting (then it, or :meth:`finish`, picks this span up). Only the worker
        that wrote the span offers its chunks, so it cannot be digested past ``start`` by
        anyone else while this runs."""
        with self._lock:
            if end > self._hashed:
                self._ready[max(start, self._hashed)] = end
        self._advance(fd, wait=False)

    def finish(self, fd: int) -> str:
        """The digest of the whole file; call once every span is done."""
        self._advance(fd, wait=True)
        if self._hashed < self._size:  # a span never reported: read the rest
            self._hashed = feed(self._digest, fd, self._hashed, self._size)
        return self._digest.finish()

    def _advance(self, fd: int, *, wait: bool) -> None:
        if not self._reader.acquire(blocking=wait):
            return
        try:
            while True:
                with self._lock:
                    end = self._ready.pop(self._hashed, None)
                if end is None:
                    return
                reached = feed(self._digest, fd, self._hashed, end)
                with self._lock:
                    self._hashed = reached
        finally:
            self._reader.release()

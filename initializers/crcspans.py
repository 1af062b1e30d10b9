"""The CRC of a file whose ranges land out of order, with no second pass over its bytes.

A CRC of two pieces is a function of their CRCs and the second one's length (``crc32_combine``
in ISA-L, ``combine_crc32c`` and ``combine_crc64nvme`` in awscrt). So each range's bytes are
digested by the worker that receives them, as they stream, whatever lands first, and the file's
CRC is put together from the ranges' at the end. :class:`initializers.checksum.SpanDigest`, which
a cryptographic hash needs (it must see the bytes in order), reads every range that did not land
at its frontier back from the page cache: for the S3 model (16 ranges at a time) that read-back
was ~9% of the CPU samples. S3's own checksums are CRCs (CRC64NVME for every object since 2025,
unless the uploader chose another).

A multipart object's ``COMPOSITE`` checksum is the CRC of its parts' CRCs: pieces are cut at the
part boundaries, and each part's CRC is put together from its own pieces. Bytes no range handed
over here (kept on disk by an earlier run, or written before a failure cut the offer short) are
read back from the file at the end, so the result is always that of the bytes on disk.
"""

from __future__ import annotations

import base64
import bisect
import itertools
import threading
from collections.abc import Callable, Sequence

from isal import isal_zlib

from initializers.checksum import Crc, feed

Step = Callable[[bytes, int], int]
Combine = Callable[[int, int, int], int]  # (crc of a, crc of b, length of b) -> crc of a + b

# algorithm -> (awscrt's name for it, width in bytes); S3's CRC-32 is ISA-L's
_AWSCRT = {"s3-crc32c": ("crc32c", 4), "crc32c": ("crc32c", 4), "s3-crc64nvme": ("crc64nvme", 8)}


def combines(algorithm: str) -> bool:
    """Whether ``algorithm`` is a CRC this module puts together from pieces."""
    return algorithm == "s3-crc32" or algorithm in _AWSCRT


def _crc(algorithm: str) -> tuple[Step, Combine, int]:
    """The running CRC, its combination and its width. awscrt is loaded only here, when a file
    needs it (~30 ms, which a run without such a checksum does not pay before its first GET)."""
    if algorithm == "s3-crc32":
        return isal_zlib.crc32, isal_zlib.crc32_combine, 4
    from awscrt import checksums as crt

    name, width = _AWSCRT[algorithm]
    return getattr(crt, name), getattr(crt, f"combine_{name}"), width


class CrcSpans:
    """The CRC (of a ``size``-byte file, of its ``parts`` when given) from pieces offered in any
    order; the same calls as :class:`initializers.checksum.SpanDigest`."""

    def __init__(self, algorithm: str, size: int, parts: Sequence[int] = ()) -> None:
        self._step, self._combine, self._width = _crc(algorithm)
        self._size = size
        self._parts = len(parts)
        self._bounds = list(itertools.accumulate(parts[:-1], initial=0)) if parts else [0]
        self._pieces: dict[int, list[int]] = {}  # start -> [end, crc]: never across a bound
        self._starts: list[int] = []  # the pieces' starts, sorted
        self._ends: dict[int, int] = {}  # end -> start, for the piece a chunk continues
        self._lock = threading.Lock()

    def offer(self, chunk: memoryview, offset: int) -> None:
        """Digest ``chunk``, just written at ``offset``, into the piece it continues (or a new
        one): its range's worker calls this in order, chunk after chunk."""
        view = memoryview(chunk)
        while view:
            index = bisect.bisect_right(self._bounds, offset)
            bound = self._bounds[index] if index < len(self._bounds) else self._size
            take = min(len(view), bound - offset)
            self._extend(offset, view[:take], at_bound=self._bounds[index - 1] == offset)
            offset, view = offset + take, view[take:]

    def _extend(self, offset: int, piece: memoryview, at_bound: bool) -> None:
        with self._lock:
            start = self._ends.pop(offset, None)
            if start is None or at_bound:
                self._forget_overwritten(offset)
                start, crc = offset, self._step(piece, 0)
                bisect.insort(self._starts, start)
            else:
                crc = self._step(piece, self._pieces[start][1])
            end = offset + len(piece)
            self._pieces[start] = [end, crc]
            self._ends[end] = start

    def _forget_overwritten(self, offset: int) -> None:
        """A new piece at ``offset``: a piece that starts there or runs past it came from an
        earlier attempt whose bytes from ``offset`` on are being written again (a source that
        cannot resume a range fetches it again from its start). It is dropped; the bytes of
        it that stay on disk are read back by :meth:`finish`."""
        index = bisect.bisect_right(self._starts, offset) - 1
        if index < 0:
            return
        start = self._starts[index]
        end = self._pieces[start][0]
        if start == offset or end > offset:
            del self._starts[index], self._pieces[start]
            self._ends.pop(end, None)

    def span_done(self, fd: int, start: int, end: int) -> None:
        """Nothing to do when a range is done: its pieces are digested; what is missing is read
        back by :meth:`finish`."""

    def finish(self, fd: int) -> str:
        """The file's CRC (``-N`` for a composite of N parts), from the pieces and the file."""
        crcs = [self._part_crc(fd, start, end) for start, end in self._part_spans()]
        if not self._parts:
            return self._encode(crcs[0])
        of_parts = b"".join(crc.to_bytes(self._width, "big") for crc in crcs)
        return f"{self._encode(self._step(of_parts, 0))}-{self._parts}"

    def _part_spans(self) -> list[tuple[int, int]]:
        return list(itertools.pairwise([*self._bounds, self._size]))

    def _part_crc(self, fd: int, start: int, end: int) -> int:
        """The CRC of ``[start, end)``: its pieces in order, the gaps between them from disk (a
        piece overlapping one already counted, left by a retry, is read from disk instead)."""
        crc, cursor = 0, start
        while cursor < end:
            piece = self._pieces.get(cursor)
            if piece is not None and piece[0] <= end:
                following, piece_crc = piece
            else:
                index = bisect.bisect_right(self._starts, cursor)
                following = min(self._starts[index], end) if index < len(self._starts) else end
                running = Crc(self._step, self._width)
                feed(running, fd, cursor, following)
                piece_crc = running.value
            crc = self._combine(crc, piece_crc, following - cursor)
            cursor = following
        return crc

    def _encode(self, crc: int) -> str:
        return base64.b64encode(crc.to_bytes(self._width, "big")).decode()

"""The small interface every source implements; the engine does everything else.

A source turns a storage URI into a :class:`Listing` (what files exist, how big, which version,
which checksum) and opens byte ranges of one file. Filtering, skipping finished work, fan-out,
retries, verification, commit and the manifest are the engine's.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Self

from initializers.streams import RangeReader

if TYPE_CHECKING:
    from initializers.filetable import FileTable
    from initializers.native import Streamed
    from initializers.options import SourceSettings


@dataclass(frozen=True, slots=True)
class Checksum:
    """An expected digest: ``algorithm`` is a :mod:`initializers.checksum` name; ``parts``, the
    sizes of a multipart object's parts where the value is a digest of its parts (``...-N``)."""

    algorithm: str
    value: str
    parts: tuple[int, ...] = field(default=(), repr=False)

    def __str__(self) -> str:
        return f"{self.algorithm}:{self.value}"


@dataclass(frozen=True, slots=True)
class RemoteFile:
    """One file a source offers, named by its path relative to the storage URI."""

    path: str
    size: int
    version: str | None  # changes whenever the content changes (ETag, blob id, ...)
    checksum: Checksum | None = None
    locator: str = ""  # source-specific address: the S3 key, the path in the repo, ...
    ranged: bool = True  # False: the source can only send it whole, from its first byte
    # The source knows of a digest it did not list (S3 lists an additional checksum's
    # algorithm, not its value): it may have to ask for it after the fetch.
    unlisted_digest: bool = False


Skipped = tuple[str, str]  # a name the source offered that is refused: (raw name, why)
Listed = tuple[str, int, str | None]  # a listed key as (path, size, version), unchecked


class Order(Enum):
    """What a listing's order says about file/folder conflicts (a key ``a`` beside ``a/b``)."""

    UNKNOWN = "unknown"  # a path is decided only once the whole listing is in
    KEYS = "keys"  # by the keys' UTF-8 bytes: ``a`` is decided once the listing passes ``a0``
    TREE = "tree"  # names from a tree (a folder, a git commit): no file is also a folder


@dataclass
class Listing:
    """Everything under a storage URI at one point in time.

    A listing of more than a page may be read on demand: ``rest`` then lists one more page
    into ``files`` and ``skipped`` each step, so fetching can start from the first page."""

    revision: str | None  # resolved commit (Hub); None where the source has no such notion
    files: list[RemoteFile] | FileTable  # a large listing is on disk, not in memory
    skipped: list[Skipped] = field(default_factory=list)
    rest: Iterator[int] | None = None  # None: listed whole
    order: Order = Order.UNKNOWN

    def complete(self) -> None:
        """List whatever is left, now."""
        if self.rest is not None:
            for _ in self.rest:
                pass
            self.rest = None


@dataclass(frozen=True)
class Layer:
    """One blob of a :class:`Layered` listing: an archive to unpack, or one file to place."""

    blob: RemoteFile  # fetched (verified, resumable) into a staging folder under blob.path
    name: str = ""  # a file to place: its path in the tree; "": an archive, unpacked


@dataclass(frozen=True)
class Layered:
    """Blobs that make the tree only together: fetched first, then unpacked in order.

    A single archive fetched by URL is one layer; an OCI artifact, one layer per blob; a
    container image, its layers with their whiteouts (a ``.wh.NAME`` entry removes what a
    lower layer wrote)."""

    layers: tuple[Layer, ...]
    revision: str | None  # what the manifest records: a rerun against the same does nothing
    root: str = ""  # keep only what is under this folder, named relative to it
    whiteouts: bool = False  # a container image's layers: later layers replace and remove

    @property
    def blobs(self) -> list[RemoteFile]:
        """Each blob once (two layers may share one)."""
        return list({layer.blob.path: layer.blob for layer in self.layers}.values())


class Source(ABC):
    """A storage backend, selected by URI scheme through :mod:`initializers.sources`."""

    def layered(self, listing: Listing) -> Layered | None:
        """What the listing makes only once unpacked (an archive, an image's layers); None,
        as for most sources, for files fetched as they are."""
        return None

    @classmethod
    @abstractmethod
    def from_settings(cls, location: str, settings: SourceSettings) -> Self:
        """Build the source for ``scheme://location``; raise UsageError for a bad location."""

    @abstractmethod
    def describe(self) -> str:
        """The URI as it may be shown in logs (never with credentials)."""

    @abstractmethod
    def list(self) -> Listing:
        """List the files under the URI; raise NotFoundError when there are none."""

    def pages_after(self, after: str | None) -> Iterator[list[Listed]] | None:
        """The listing resumed past the path ``after`` (None: from its start), in key order, a
        page at a time, each key as it is listed (its name relative to the URI, not yet checked
        as a path; folder placeholders included); None where the source cannot resume a listing
        at a key. The warm rerun's check lists key ranges with it in parallel
        (:mod:`initializers.unchanged`) and compares a page at once."""
        return None

    @abstractmethod
    def open_range(self, file: RemoteFile, start: int, end: int) -> RangeReader:
        """Open bytes ``[start, end)`` of ``file``."""

    fetches_whole = False  # has fetch_whole: small files go over the native event loop

    def fetch_whole(self, file: RemoteFile) -> AbstractAsyncContextManager[Streamed]:
        """GET the whole of a small ``file`` on the native loop (:mod:`initializers.native`):
        its response, whose body is read inside, as it arrives. Only where ``fetches_whole``."""
        raise NotImplementedError

    def check_access(self, file: RemoteFile) -> None:
        """Prove the caller may read ``file`` (not empty) or raise AuthError, reading as few
        bytes as the protocol allows: here its first one; a source with a bodiless check (a
        HEAD the store authorizes as a GET) overrides it."""
        with self.open_range(file, 0, 1) as reader:
            next(iter(reader.chunks()), None)

    def checksum_for(self, file: RemoteFile, headers: Mapping[str, str]) -> Checksum | None:
        """The digest to verify, given the response headers (a source may withdraw it)."""
        return file.checksum

    def other_checksums(self, file: RemoteFile, expected: Checksum) -> Iterator[Checksum]:
        """After ``expected`` did not match the bytes: other digests of the same object that
        may, where the first can be wrong for a reason other than the bytes (S3: part sizes
        inferred, a server's checksum of the parts computed its own way). None by default:
        the mismatch stands."""
        return iter(())

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release pooled connections."""

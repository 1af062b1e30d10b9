"""Archives (``.tar``, ``.tar.gz``/``.tgz``, ``.zip``) fetched by URL and unpacked, safely.

The archive is fetched by the engine like any file (verified, resumable) into a hidden staging
folder of the destination, ``.initializer-archive/``, never under a final name. Its members are
then written as the engine writes files: into ``.NAME.part``, made durable in batches by the
group commit, renamed, recorded, and the manifest written last. The manifest records the
archive's version (ETag, or size and date), so a rerun against an unchanged URL does nothing.

What a hostile archive cannot do: write outside the destination (absolute names, ``..``,
symlinks or hard links pointing outside are skipped with a warning), create device files or
FIFOs (skipped), or fill the volume (a member that would take the unpacked size past the free
space stops the run with exit 6 before it is written). Links to members inside the archive are
written as copies of their target, so no link is ever created on disk. The data of each member
is checked by the format where it has a check (zip's CRC-32 per member, gzip's CRC-32 of the
stream); a plain ``.tar`` has none beyond the archive's size and version.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import logging
import os
import posixpath
import shutil
import stat
import sys
import tarfile
import threading
import zipfile
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import IO

from isal import igzip, isal_zlib

from initializers.commits import GroupCommit, Verified
from initializers.destination import destination_lock, inside, storage_error
from initializers.engine import Engine, Outcome
from initializers.errors import IntegrityError, Interrupted, LocalStorageError, NotFoundError
from initializers.fsutil import (
    UnsafePathError,
    boot_id,
    fsync_dir,
    make_room_for,
    part_path,
    safe_relpath,
    write_all,
)
from initializers.journal import CommitLog
from initializers.manifest import (
    FileRecord,
    Manifest,
    read_manifest,
    record_is_intact,
    remove_manifest,
    write_manifest,
)
from initializers.progress import human_bytes
from initializers.sources.base import Layer, Layered, RemoteFile

log = logging.getLogger(__name__)

STAGING = ".initializer-archive"
GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
COPY_CHUNK = 1 << 20
COPY_EXTENT = 64 << 20  # per copy_file_range call: a stop is seen between calls
WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"  # a folder whose lower layers' content is hidden
MAX_LINK_HOPS = 40


@dataclass(frozen=True)
class Member:
    """One entry of an archive, as far as unpacking needs to know it."""

    name: str
    size: int
    kind: str  # "file", "dir", "link" (a symlink or hard link), "other"
    target: str | None  # a link's target, from the archive's root; None when it leaves it
    open: Callable[[], IO[bytes]]
    staged: Path | None = None  # a whole verified blob placed as it is: renamed, not copied
    extent: tuple[Path, int] | None = None  # (file, offset): its bytes lie there as they are


@dataclass(frozen=True)
class _Placed:
    """A member where it lands in the tree: from which layer, at which place in it."""

    layer: int
    position: int
    member: Member


def sync_layers(
    plan: Layered,
    dest: Path,
    source_uri: str,
    make_engine: Callable[[Path], Engine],
    choose: Callable[[list[RemoteFile]], list[RemoteFile]],
    stop: threading.Event,
    durable: bool = True,
) -> Outcome:
    """Fetch the plan's blobs into the staging folder, unpack them into ``dest``, write the
    manifest; nothing at all when the manifest says this revision is already there and its
    files can be trusted (synced, or written during this boot). Not ``durable``: nothing waits
    for the disk, and the manifest says so, so a run after a crash unpacks everything again."""
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise storage_error(exc, dest) from None
    with destination_lock(dest, stop):
        old = read_manifest(dest)
        if (
            old is not None
            and old.source == source_uri
            and old.revision == plan.revision
            and old.trusted(boot_id())
            and all(record_is_intact(dest, path, record) for path, record in old.files.items())
        ):
            total = sum(record.size for record in old.files.values())
            return Outcome(len(old.files), 0, total, 0, up_to_date=True)
        staging = dest / STAGING
        fetched = make_engine(staging).sync(plan.blobs, source_uri, plan.revision)
        remove_manifest(dest)
        records = unpack_layers(plan, staging, dest, choose, stop, durable)
        for path in sorted(set(old.files) - set(records) if old else ()):
            target = dest / path
            if inside(dest, target) and target.is_file() and not target.is_symlink():
                target.unlink()
        try:
            finished = Manifest(
                source_uri, plan.revision, records, boot_id=boot_id(), durable=durable
            )
            write_manifest(dest, finished)
        except OSError as exc:
            raise storage_error(exc, dest) from None
        shutil.rmtree(staging, ignore_errors=True)
    log.info("unpacked %s", ", ".join(_layer_name(layer) for layer in plan.layers))
    fetched.files_total = fetched.files_fetched = len(records)
    fetched.bytes_total = _total(records)
    return fetched


def unpack(
    archive: Path,
    dest: Path,
    version: str | None,
    choose: Callable[[list[RemoteFile]], list[RemoteFile]],
    stop: threading.Event,
) -> dict[str, FileRecord]:
    """Write one archive's safe members that ``choose`` keeps into ``dest``."""
    blob = RemoteFile(archive.name, archive.stat().st_size, version)
    return unpack_layers(Layered((Layer(blob),), version), archive.parent, dest, choose, stop)


def unpack_layers(
    plan: Layered,
    staging: Path,
    dest: Path,
    choose: Callable[[list[RemoteFile]], list[RemoteFile]],
    stop: threading.Event,
    durable: bool = True,
) -> dict[str, FileRecord]:
    """Write the tree the plan's layers make (their safe members that ``choose`` keeps) into
    ``dest``; returns their manifest records. Every layer's member list is read first (for a
    compressed tar, one more pass over its stream): what later layers remove, the allow/ignore
    patterns and the weights preference need the whole tree. Members are then written layer by
    layer in archive order, so a compressed stream is read forward."""
    with contextlib.ExitStack() as layers:
        tree = _Tree()
        for index, layer in enumerate(plan.layers):
            members = (
                _placed_file(layer, staging)
                if layer.name
                else layers.enter_context(_ArchiveMembers(staging / layer.blob.path))
            )
            for position, member in enumerate(members):
                if _wanted(member.name, plan.root):
                    _apply(tree, _Placed(index, position, member), plan.whiteouts)
        kept = _resolve_links(tree.placed)
        if plan.root:
            prefix = f"{plan.root}/"
            kept = {n.removeprefix(prefix): p for n, p in kept.items() if n.startswith(prefix)}
        if not kept:
            where = f" under {plan.root}/" if plan.root else ""
            raise NotFoundError(
                f"{_names(plan)} holds no file{where} that can be unpacked safely"
                + ("; name the folder to keep as the URI's sub-path" if plan.root else "")
            )
        chosen = choose([RemoteFile(n, p.member.size, plan.revision) for n, p in kept.items()])
        _check_room(_names(plan), dest, chosen)
        log.info(
            "unpacking %s: %d files, %s",
            _names(plan),
            len(chosen),
            human_bytes(sum(f.size for f in chosen)),
        )
        commits = CommitLog(dest, durable=durable)
        group = GroupCommit(dest, commits)
        uses = Counter(id(kept[f.path].member) for f in chosen)
        for file in sorted(chosen, key=lambda f: (kept[f.path].layer, kept[f.path].position)):
            member = kept[file.path].member
            uses[id(member)] -= 1
            last_use = uses[id(member)] == 0
            _write_member(dest, file.path, member, group, plan.revision, stop, last_use)
    try:
        group.flush()
    except OSError as exc:
        raise storage_error(exc, dest) from None
    if durable:
        for folder in {os.path.dirname(path) for path in group.records}:
            fsync_dir(dest / folder)
    commits.remove()
    return group.records


def _placed_file(layer: Layer, staging: Path) -> list[Member]:
    """A blob that is one file: a member named as the layer says, its bytes the staged blob."""
    staged = staging / layer.blob.path
    return [Member(layer.name, layer.blob.size, "file", None, staged.open, staged=staged)]


def _wanted(raw: str, root: str) -> bool:
    """Whether a member can matter to the folder ``root`` ("": everything): one inside it, or
    a whiteout that may remove it. Others are passed over without a word (a container image
    holds a whole system, whose devices and absolute links are nobody's concern here)."""
    name = raw.removeprefix("./").lstrip("/")
    if not root or name == root or name.startswith(f"{root}/"):
        return True
    return posixpath.basename(name.rstrip("/")).startswith(WHITEOUT)


class _Tree:
    """The members the layers so far make, by name. It remembers every name that was ever a
    folder, so a file laid over a name walks the tree only where it may replace a folder: a
    walk per member made an image of 20,000 files take 12.5 s to plan."""

    def __init__(self) -> None:
        self.placed: dict[str, _Placed] = {}
        self._folders: set[str] = set()

    def put(self, name: str, placed: _Placed) -> None:
        self.placed[name] = placed
        folder = posixpath.dirname(name)
        while folder and folder not in self._folders:
            self._folders.add(folder)
            folder = posixpath.dirname(folder)

    def remove_below(self, folder: str, layer: int) -> None:
        """Drop what layers below ``layer`` put under ``folder`` ("": the root)."""
        if folder and folder not in self._folders:
            return
        prefix = f"{folder}/" if folder else ""
        below = [n for n, p in self.placed.items() if n.startswith(prefix) and p.layer < layer]
        for name in below:
            del self.placed[name]


def _apply(tree: _Tree, placed: _Placed, whiteouts: bool) -> None:
    """Lay one member over the tree the layers below it made."""
    member = placed.member
    name = _checked_name(member)
    if name is None:
        return
    if whiteouts:
        folder, base = posixpath.split(name)
        if base == OPAQUE:
            tree.remove_below(folder, placed.layer)
            return
        if base.startswith(WHITEOUT):
            hidden = posixpath.join(folder, base[len(WHITEOUT) :])
            tree.placed.pop(hidden, None)
            tree.remove_below(hidden, placed.layer)
            return
        tree.placed.pop(name, None)  # what a lower layer had under this name: a file, or a link
        if member.kind != "dir":  # a folder entry merges with the folder below; a file does not
            tree.remove_below(name, placed.layer)
            tree.put(name, placed)
        return
    if member.kind == "dir":
        return
    if name in tree.placed:
        log.warning("skipped %r: it appears twice in the archive; the first is kept", name)
        return
    tree.put(name, placed)


def _resolve_links(tree: dict[str, _Placed]) -> dict[str, _Placed]:
    """The tree with each link replaced by a copy of the file it leads to (no link is ever
    made on disk); a link to nothing the tree holds is skipped with a warning."""
    kept: dict[str, _Placed] = {}
    for name, placed in tree.items():
        target, hops = placed, 0
        while target.member.kind == "link" and hops < MAX_LINK_HOPS:
            found = tree.get(target.member.target or "")
            if found is None:
                break
            target, hops = found, hops + 1
        if target.member.kind != "file":
            log.warning("skipped %r: a link to a file the unpacked tree does not hold", name)
            continue
        kept[name] = target  # written where its data is read: a stream is read forward
    return kept


def _layer_name(layer: Layer) -> str:
    return layer.name or layer.blob.path


def _names(plan: Layered) -> str:
    names = [_layer_name(layer) for layer in plan.layers]
    return names[0] if len(names) == 1 else f"{len(names)} layers"


def _check_room(what: str, dest: Path, chosen: list[RemoteFile]) -> None:
    """Refuse, before writing anything, an archive that unpacks to more than the free space:
    the declared sizes are what gets written (each member's reader stops at its size)."""
    free = shutil.disk_usage(dest).free
    needed = sum(file.size for file in chosen)
    if needed > free:
        raise LocalStorageError(
            f"{what} unpacks to {human_bytes(needed)} but {dest} has "
            f"{human_bytes(free)} free; use a bigger volume, or check the archive is what "
            "you meant to fetch"
        )


def _checked_name(member: Member) -> str | None:
    """The member's safe relative name, or None (with a warning) when it must be skipped."""
    raw = member.name.removeprefix("./")
    if member.kind == "dir":
        raw = raw.rstrip("/")
        if raw in ("", "."):
            return None  # the archive's own top folder
    try:
        name = safe_relpath(raw)
    except UnsafePathError as exc:
        log.warning("skipped %r from the archive: the name %s", member.name, exc)
        return None
    if member.kind == "other":
        log.warning("skipped %r from the archive: not a regular file, folder or link", name)
        return None
    if member.kind == "link" and member.target is None:
        log.warning("skipped %r from the archive: a link pointing outside it", name)
        return None
    return name


def _inside_archive(target: str, base: str = "") -> str | None:
    """``target`` (relative to the folder ``base``) from the archive's root; None if it leaves."""
    if not target or target.startswith("/"):
        return None
    resolved = posixpath.normpath(posixpath.join(base, target))
    return None if resolved == ".." or resolved.startswith("../") else resolved


def _write_member(
    dest: Path,
    name: str,
    member: Member,
    group: GroupCommit,
    version: str | None,
    stop: threading.Event,
    last_use: bool = True,
) -> None:
    _unless_stopped(stop)
    final = dest / name
    try:
        make_room_for(dest, final, None, "the archive")
    except OSError as exc:
        raise storage_error(exc, final) from None
    part = part_path(final)
    moved = member.staged is not None and last_use  # a verified blob: moved, not copied
    try:
        if moved:
            assert member.staged is not None
            os.replace(member.staged, part)
            fd = os.open(part, os.O_RDWR | os.O_NOFOLLOW)
        else:
            fd = os.open(part, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        raise storage_error(exc, final) from None
    try:
        size = os.fstat(fd).st_size if moved else _copy(member, fd, stop)
        if member.kind == "file" and size != member.size:
            raise IntegrityError(
                f"{name}: the archive says {member.size} bytes, its data has {size}"
            )
        group.add(fd, Verified(name, part, final, size, None, version, on_commit=lambda: None))
    except OSError as exc:
        raise storage_error(exc, final) from None
    finally:
        os.close(fd)


def _unless_stopped(stop: threading.Event) -> None:
    if stop.is_set():
        raise Interrupted("stopped by a signal while unpacking; rerun to finish")


def _copy(member: Member, fd: int, stop: threading.Event) -> int:
    """Write the member's data to ``fd``; the number of bytes written."""
    if member.extent is not None:
        with contextlib.suppress(OSError):  # a kernel or filesystem without it: read and write
            return _copy_extent(member.extent, member.size, fd, stop)
        os.lseek(fd, 0, os.SEEK_SET)
        os.ftruncate(fd, 0)
    size = 0
    try:
        with member.open() as body:
            while chunk := body.read(COPY_CHUNK):
                _unless_stopped(stop)  # SIGTERM: within a chunk, even inside a huge member
                write_all(fd, memoryview(chunk), size)
                size += len(chunk)
    except OSError as exc:
        if exc.errno is not None:  # the disk's, not the archive's
            raise
        raise _damaged(member, exc) from None
    except (EOFError, zipfile.BadZipFile, tarfile.TarError, isal_zlib.error, _zstd_errors()) as exc:
        raise _damaged(member, exc) from None
    return size


class _ArchiveMembers(AbstractContextManager["Iterator[Member]"]):
    """The members of a tar (any compression tarfile reads) or zip archive, in archive order."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._archive: tarfile.TarFile | zipfile.ZipFile | None = None
        self._gunzipped: IO[bytes] | None = None

    def __enter__(self) -> Iterator[Member]:
        try:
            if self._path.name.lower().endswith(".zip"):
                self._archive = zipfile.ZipFile(self._path)
                return _zip_members(self._archive)
            with self._path.open("rb") as head:
                magic = head.read(4)
            if magic.startswith(GZIP_MAGIC):  # ISA-L's gunzip: 2.6x the speed of zlib's here
                self._gunzipped = igzip.open(self._path, "rb")
                self._archive = tarfile.open(fileobj=self._gunzipped, mode="r:")
            elif magic == ZSTD_MAGIC:  # an OCI layer's tar+zstd
                self._gunzipped = _zstd_file(self._path)
                self._archive = tarfile.open(fileobj=self._gunzipped, mode="r:")
            else:
                self._archive = tarfile.open(self._path, "r:*")
                if isinstance(self._archive.fileobj, io.BufferedReader):  # not bz2 or xz
                    return _tar_members(self._archive, plain=self._path)
            return _tar_members(self._archive)
        except (
            OSError,
            EOFError,
            zipfile.BadZipFile,
            tarfile.TarError,
            isal_zlib.error,
            _zstd_errors(),
        ) as exc:
            raise IntegrityError(f"{self._path.name} is not a readable archive ({exc})") from None

    def __exit__(self, *exc: object) -> None:
        if self._archive is not None:
            self._archive.close()
        if self._gunzipped is not None:  # tarfile leaves a file object it was given open
            self._gunzipped.close()


def _copy_extent(extent: tuple[Path, int], size: int, fd: int, stop: threading.Event) -> int:
    """Copy ``size`` bytes at ``extent`` into ``fd`` inside the kernel (``copy_file_range``: no
    pass through Python, and a filesystem with reflinks shares the blocks); the count copied,
    short when the archive ends early."""
    path, offset = extent
    copied = 0
    with path.open("rb") as source:
        while copied < size:
            _unless_stopped(stop)
            count = min(COPY_EXTENT, size - copied)
            moved = os.copy_file_range(source.fileno(), fd, count, offset + copied, copied)
            if moved == 0:
                break
            copied += moved
    return copied


def _damaged(member: Member, exc: BaseException) -> IntegrityError:
    return IntegrityError(f"{member.name}: the archive is damaged ({exc}); fetch it again")


def _zstd_file(path: Path) -> IO[bytes]:
    """A tar+zstd layer, decompressed as it is read (seeking back starts over, as gzip's)."""
    return _zstd().ZstdFile(path, "rb")


def _zstd() -> ModuleType:
    """Python's zstd module (3.14+), or its backport; imported only once a zstd layer is read."""
    if sys.version_info >= (3, 14):
        return importlib.import_module("compression.zstd")
    return importlib.import_module("backports.zstd")


def _zstd_errors() -> type[Exception]:
    loaded = sys.modules.get("compression.zstd") or sys.modules.get("backports.zstd")
    return loaded.ZstdError if loaded is not None else IntegrityError


def _tar_members(archive: tarfile.TarFile, plain: Path | None = None) -> Iterator[Member]:
    """The members of a tar; of an uncompressed one (``plain``, its file), each regular
    member's extent in it, so its bytes are copied by the kernel."""
    try:
        for info in archive:
            if info.isdir():
                kind = "dir"
            elif info.isreg():
                kind = "file"
            elif info.issym() or info.islnk():
                kind = "link"
            else:
                kind = "other"
            target = None
            if info.issym():  # relative to the link's folder
                target = _inside_archive(info.linkname, posixpath.dirname(info.name))
            elif info.islnk():  # a hard link names its target from the archive's root
                target = _inside_archive(info.linkname)
            extent = (plain, info.offset_data) if plain and kind == "file" else None
            if info.issparse():
                extent = None
            opener = _tar_opener(archive, info)
            yield Member(info.name, info.size, kind, target, opener, extent=extent)
    except (EOFError, igzip.BadGzipFile, tarfile.TarError, isal_zlib.error) as exc:
        raise IntegrityError(f"the archive is damaged ({exc}); fetch it again") from None


def _tar_opener(archive: tarfile.TarFile, info: tarfile.TarInfo) -> Callable[[], IO[bytes]]:
    def open_body() -> IO[bytes]:
        try:
            body = archive.extractfile(info)  # a link: its target's data
        except KeyError:
            body = None
        if body is None:
            raise IntegrityError(f"{info.name}: a link to a member the archive does not hold")
        return body

    return open_body


def _zip_members(archive: zipfile.ZipFile) -> Iterator[Member]:
    by_name = {info.filename: info for info in archive.infolist()}
    for info in archive.infolist():
        mode = info.external_attr >> 16
        if info.is_dir():
            yield Member(info.filename, 0, "dir", None, _nothing)
        elif stat.S_ISLNK(mode):
            link = archive.read(info).decode("utf-8", "replace")
            target = _inside_archive(link, posixpath.dirname(info.filename))
            linked = by_name.get(target) if target else None
            size = linked.file_size if linked else 0
            yield Member(info.filename, size, "link", target, _zip_opener(archive, info, linked))
        elif stat.S_IFMT(mode) not in (0, stat.S_IFREG):  # 0: no type recorded
            yield Member(info.filename, 0, "other", None, _nothing)
        else:
            yield Member(
                info.filename, info.file_size, "file", None, _zip_opener(archive, info, info)
            )


def _zip_opener(
    archive: zipfile.ZipFile, info: zipfile.ZipInfo, data: zipfile.ZipInfo | None
) -> Callable[[], IO[bytes]]:
    def open_body() -> IO[bytes]:
        if data is None or data.is_dir():
            raise IntegrityError(f"{info.filename}: a link to a member the archive does not hold")
        return archive.open(data)

    return open_body


def _nothing() -> IO[bytes]:
    raise AssertionError("folders and special files are never opened")


def _total(records: dict[str, FileRecord]) -> int:
    return sum(record.size for record in records.values())

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

import logging
import os
import posixpath
import shutil
import stat
import tarfile
import threading
import zipfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import IO

from isal import igzip, isal_zlib

from initializers.commits import GroupCommit, Verified
from initializers.destination import destination_lock, inside, storage_error
from initializers.engine import Engine, Outcome
from initializers.errors import IntegrityError, Interrupted, LocalStorageError
from initializers.fsutil import (
    UnsafePathError,
    fsync_dir,
    make_room_for,
    part_path,
    safe_relpath,
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
from initializers.sources.base import RemoteFile, Source

log = logging.getLogger(__name__)

STAGING = ".initializer-archive"
GZIP_MAGIC = b"\x1f\x8b"
SUFFIXES = (".tar", ".tar.gz", ".tgz", ".zip")
COPY_CHUNK = 1 << 20


def is_archive(name: str) -> bool:
    return name.lower().endswith(SUFFIXES)


def archive_to_unpack(source: Source, files: Iterable[RemoteFile]) -> RemoteFile | None:
    """The one file to unpack, when the source unpacks archives and lists just one."""
    if not source.unpacks_archives:
        return None
    first_two = list(islice(files, 2))
    if len(first_two) == 1 and is_archive(first_two[0].path):
        return first_two[0]
    return None


@dataclass(frozen=True)
class Member:
    """One entry of an archive, as far as unpacking needs to know it."""

    name: str
    size: int
    kind: str  # "file", "dir", "link" (a symlink or hard link), "other"
    target: str | None  # a link's target, from the archive's root; None when it leaves it
    open: Callable[[], IO[bytes]]


def sync_archive(
    archive: RemoteFile,
    dest: Path,
    source_uri: str,
    make_engine: Callable[[Path], Engine],
    choose: Callable[[list[RemoteFile]], list[RemoteFile]],
    stop: threading.Event,
) -> Outcome:
    """Fetch ``archive`` into the staging folder, unpack it into ``dest``, write the manifest."""
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise storage_error(exc, dest) from None
    with destination_lock(dest, stop):
        old = read_manifest(dest)
        if (
            old is not None
            and old.source == source_uri
            and old.revision == archive.version
            and all(record_is_intact(dest, path, record) for path, record in old.files.items())
        ):
            total = sum(record.size for record in old.files.values())
            return Outcome(len(old.files), 0, total, 0, up_to_date=True)
        staging = dest / STAGING
        fetched = make_engine(staging).sync([archive], source_uri, archive.version)
        remove_manifest(dest)
        records = unpack(staging / archive.path, dest, archive.version, choose, stop)
        for path in sorted(set(old.files) - set(records) if old else ()):
            target = dest / path
            if inside(dest, target) and target.is_file() and not target.is_symlink():
                target.unlink()
        try:
            write_manifest(
                dest, Manifest(source=source_uri, revision=archive.version, files=records)
            )
        except OSError as exc:
            raise storage_error(exc, dest) from None
        shutil.rmtree(staging, ignore_errors=True)
    log.info("unpacked %s", archive.path)
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
    """Write the archive's safe members that ``choose`` keeps into ``dest``; returns their
    manifest records. The whole member list is read first (for a compressed tar, one more
    pass over the stream): the allow/ignore patterns and the weights preference need it."""
    with _ArchiveMembers(archive) as all_members:
        members: dict[str, Member] = {}
        for member in all_members:
            name = _checked_name(member)
            if name is None or member.kind == "dir":
                continue
            if name in members:
                log.warning("skipped %r: it appears twice in the archive; the first is kept", name)
                continue
            members[name] = member
        if not members:
            raise IntegrityError(f"{archive.name} holds no file that can be unpacked safely")
        chosen = choose([RemoteFile(name, m.size, version) for name, m in members.items()])
        _check_room(archive, dest, chosen)
        log.info(
            "unpacking %s: %d files, %s",
            archive.name,
            len(chosen),
            human_bytes(sum(f.size for f in chosen)),
        )
        commits = CommitLog(dest)
        group = GroupCommit(dest, commits)
        for file in chosen:
            _write_member(dest, file.path, members[file.path], group, version, stop)
    try:
        group.flush()
    except OSError as exc:
        raise storage_error(exc, dest) from None
    for folder in {os.path.dirname(path) for path in group.records}:
        fsync_dir(dest / folder)
    commits.remove()
    return group.records


def _check_room(archive: Path, dest: Path, chosen: list[RemoteFile]) -> None:
    """Refuse, before writing anything, an archive that unpacks to more than the free space:
    the declared sizes are what gets written (each member's reader stops at its size)."""
    free = shutil.disk_usage(dest).free
    needed = sum(file.size for file in chosen)
    if needed > free:
        raise LocalStorageError(
            f"{archive.name} unpacks to {human_bytes(needed)} but {dest} has "
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
) -> None:
    final = dest / name
    try:
        make_room_for(dest, final, None, "the archive")
    except OSError as exc:
        raise storage_error(exc, final) from None
    part = part_path(final)
    try:
        fd = os.open(part, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        raise storage_error(exc, final) from None
    try:
        size = 0
        try:
            with member.open() as body:
                while chunk := body.read(COPY_CHUNK):
                    if stop.is_set():  # SIGTERM: within a chunk, even inside a huge member
                        raise Interrupted("stopped by a signal while unpacking; rerun to finish")
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(fd, view) :]
                    size += len(chunk)
        except (OSError, EOFError, zipfile.BadZipFile, tarfile.TarError, isal_zlib.error) as exc:
            if isinstance(exc, OSError) and exc.errno is not None:
                raise storage_error(exc, final) from None
            raise IntegrityError(
                f"{name}: the archive is damaged ({exc}); fetch it again"
            ) from None
        if member.kind == "file" and size != member.size:
            raise IntegrityError(
                f"{name}: the archive says {member.size} bytes, its data has {size}"
            )
        group.add(fd, Verified(name, part, final, size, None, version, on_commit=lambda: None))
    finally:
        os.close(fd)


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
                gzipped = head.read(2) == GZIP_MAGIC
            if gzipped:  # through ISA-L's gunzip: 2.6x the speed of tarfile's (zlib) here
                self._gunzipped = igzip.open(self._path, "rb")
                self._archive = tarfile.open(fileobj=self._gunzipped, mode="r:")
            else:
                self._archive = tarfile.open(self._path, "r:*")
            return _tar_members(self._archive)
        except (OSError, EOFError, zipfile.BadZipFile, tarfile.TarError, isal_zlib.error) as exc:
            raise IntegrityError(f"{self._path.name} is not a readable archive ({exc})") from None

    def __exit__(self, *exc: object) -> None:
        if self._archive is not None:
            self._archive.close()
        if self._gunzipped is not None:  # tarfile leaves a file object it was given open
            self._gunzipped.close()


def _tar_members(archive: tarfile.TarFile) -> Iterator[Member]:
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
            yield Member(info.name, info.size, kind, target, _tar_opener(archive, info))
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

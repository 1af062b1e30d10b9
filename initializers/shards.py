"""Sharding: K initializer pods (an Indexed Job) fill one destination, each its share, at once.

Every pod lists the source and computes the same partition from the listing alone, so they agree
without talking to each other. The partition balances bytes (largest file first, to the least
loaded shard). Files are never split across shards: a file's checksum covers all of its bytes,
and a file fetched by several pods could only be verified by one of them reading all of it back
from the shared volume, which costs as much as the fetch; the largest file therefore bounds the
largest share, and the log says how far from an even split that leaves each shard.

Under the destination::

    .initializer-shards/plan.json          which listing the shards work from (its digest), K, the
                                           run, and the name of...
    .initializer-shards/previous-X.json    ...a copy of the last complete tree's manifest
    .initializer-shards/shard-I-D.json     shard I's record of what it committed (digest D)
    .initializer-shard-I.lock              held while a pod works on shard I
    .initializer-commits-shard-I.jsonl     shard I's commits not yet in its record

The pod whose record completes the set writes the manifest, under the destination's lock, and
removes the plan. A pod restarted at any point resumes its own share; one that finds the manifest
complete exits at once. A listing that differs from the plan's means the source changed while
the shards started: the pod fails (exit 5) rather than build a tree of two versions. A plan of
an earlier run (``SHARD_RUN`` differs; the runtimes set it to the Job's UID) is replaced.
"""

from __future__ import annotations

import contextlib
import heapq
import json
import logging
import os
import secrets
import shutil
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import zip_longest
from operator import itemgetter
from pathlib import Path

from initializers.cache import asset_material, key_material, material_digest
from initializers.destination import LOCK_NAME, FileLock, inside, storage_error
from initializers.engine import Engine, Outcome, Share
from initializers.errors import IntegrityError, LocalStorageError, UsageError
from initializers.filetable import COLUMNS, FileTable
from initializers.fsutil import atomic_write_bytes, boot_id
from initializers.manifest import (
    FileRecord,
    manifest_path,
    manifest_records,
    read_manifest_head,
    record_is_intact,
    write_manifest_records,
)
from initializers.progress import human_bytes
from initializers.sources.base import RemoteFile

log = logging.getLogger(__name__)

STATE = ".initializer-shards"


@dataclass(frozen=True)
class ShardSpec:
    """This pod's place: shard ``index`` of ``count``, in run ``run`` ("" when not told)."""

    count: int
    index: int
    run: str = ""


def partition(files: Iterable[RemoteFile], count: int) -> list[list[RemoteFile]]:
    """``count`` shares of ``files`` with bytes balanced: each file, largest first, goes to the
    share with the fewest bytes so far (ties: the lowest index). The same listing always gives
    the same shares."""
    shares: list[list[RemoteFile]] = [[] for _ in range(count)]
    for index, file in _deal(sorted(files, key=lambda f: (-f.size, f.path)), count):
        shares[index].append(file)
    return shares


def _deal(ordered: Iterable[RemoteFile], count: int) -> Iterator[tuple[int, RemoteFile]]:
    """:func:`partition`'s rule over files already largest first: each file's share."""
    loads = [(0, index) for index in range(count)]
    for file in ordered:
        load, index = heapq.heappop(loads)
        yield index, file
        heapq.heappush(loads, (load + max(file.size, 1), index))


def share(files: FileTable, spec: ShardSpec) -> tuple[FileTable, list[int]]:
    """This pod's share of ``files`` (in a table: a million files are not held) and every
    share's bytes, dealt from the listing read largest first."""
    mine, totals = files.sibling(), [0] * spec.count
    ordered = files.query(f"SELECT {COLUMNS} FROM {files.name} ORDER BY size DESC, path")
    for index, file in _deal(ordered, spec.count):
        totals[index] += file.size
        if index == spec.index:
            mine.append(file)
    mine.flush()
    return mine, totals


def sync_shard(
    make_engine: Callable[[Share], Engine],
    dest: Path,
    files: FileTable,
    revision: str | None,
    source_uri: str,
    spec: ShardSpec,
) -> Outcome:
    """Fetch this pod's share of ``files`` into ``dest``; the last shard to finish writes the
    manifest. Returns this shard's outcome (``up_to_date`` when the tree was already complete)."""
    if _complete(dest, files, source_uri, revision):
        return Outcome(len(files), 0, files.total_bytes, 0, up_to_date=True)
    digest = material_digest(key_material(asset_material(source_uri, revision, ()), files))
    state = dest / STATE
    try:
        state.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise storage_error(exc, state) from None
    _join_plan(state, digest, files, spec, dest)
    mine, totals = share(files, spec)
    log.info(
        "shard %d (of %d, from 0): %d of %d files, %s (the largest share %s, an even split %s: "
        "files are not split)",
        spec.index,
        spec.count,
        len(mine),
        len(files),
        human_bytes(mine.total_bytes),
        human_bytes(max(totals)),
        human_bytes(files.total_bytes / spec.count),
    )
    record = state / f"shard-{spec.index}-{digest[:16]}.json"
    known = tuple(sorted(state.glob("shard-*.json")))  # any shard's of any run: kept if current
    outcome = make_engine(Share(spec.index, record, known)).sync(mine, source_uri, revision)
    _finish(dest, state, digest, files, source_uri, revision, spec)
    return outcome


def _complete(dest: Path, files: FileTable, source_uri: str, revision: str | None) -> bool:
    """True when the manifest already vouches for exactly ``files`` as they are now: both read
    in path order, side by side."""
    path = manifest_path(dest)
    head = read_manifest_head(path)
    if head is None or head.source != source_uri or head.revision != revision:
        return False
    listed = files.query(f"SELECT {COLUMNS} FROM {files.name} ORDER BY path")
    try:
        for pair in zip_longest(manifest_records(path), listed):
            if None in pair:
                return False
            (name, record), file = pair
            if not (
                name == file.path
                and record.size == file.size
                and record.version == file.version
                and record_is_intact(dest, name, record)
            ):
                return False
    except ValueError:
        return False
    return True


def _join_plan(state: Path, digest: str, files: FileTable, spec: ShardSpec, dest: Path) -> None:
    """Make sure every shard of this run works from one listing: write the plan if there is
    none (or only an earlier run's), else check this pod's listing against it. The plan's
    writer keeps a copy of the last complete tree's manifest: the finisher removes what it
    had that the listing no longer has."""
    plan_path = state / "plan.json"
    mine = {
        "digest": digest,
        "shards": spec.count,
        "run": spec.run,
        "files": len(files),
        "bytes": files.total_bytes,
        "created": time.time(),
        "previous": _keep_previous(state, dest),
    }
    try:
        _settle(plan_path, mine, spec)
    finally:
        with contextlib.suppress(OSError):
            plan = _read_json(plan_path) or {}
            if mine["previous"] and plan.get("previous") != mine["previous"]:
                (state / mine["previous"]).unlink()


def _keep_previous(state: Path, dest: Path) -> str:
    """A copy of the manifest of the last complete tree, if any; its name under ``state``."""
    name = f"previous-{secrets.token_hex(6)}.json"
    try:
        shutil.copyfile(manifest_path(dest), state / name)
    except FileNotFoundError:
        return ""
    except OSError as exc:
        raise storage_error(exc, state) from None
    return name


def _settle(plan_path: Path, mine: dict, spec: ShardSpec) -> None:
    for _ in range(3):
        plan = _read_json(plan_path)
        if plan is None:
            if _create(plan_path, mine):
                return
            continue
        earlier_run = spec.run and plan.get("run") and plan.get("run") != spec.run
        if earlier_run:
            log.info("shards: replacing the plan of an earlier run (%s)", plan.get("run"))
            atomic_write_bytes(plan_path, json.dumps(mine).encode())
            return
        if plan.get("shards") != spec.count:
            raise UsageError(
                f"this pod says {spec.count} shards, but the plan in {plan_path} says "
                f"{plan.get('shards')}; give every pod the same SHARDS (a plan an earlier run "
                "left is replaced when SHARD_RUN differs; else remove it)"
            )
        if plan.get("digest") != mine["digest"]:
            raise IntegrityError(
                f"the source changed while the shards started: the plan lists "
                f"{plan.get('files')} files ({human_bytes(plan.get('bytes', 0))}), this pod "
                f"{mine['files']} ({human_bytes(mine['bytes'])}); no mixed tree is built: rerun "
                f"the job (a new run replaces the plan when SHARD_RUN differs; else remove "
                f"{plan_path})"
            )
        return
    raise LocalStorageError(f"cannot settle the shard plan {plan_path}; check the volume")


def _finish(
    dest: Path,
    state: Path,
    digest: str,
    files: FileTable,
    source_uri: str,
    revision: str | None,
    spec: ShardSpec,
) -> None:
    """Write the manifest when every shard's record is there (under the destination's lock, so
    exactly one pod writes it); else leave it to the last one."""
    finisher = FileLock(
        dest / LOCK_NAME, waiting=lambda: "shards: another shard is checking whether all are done"
    )
    with finisher:
        if _complete(dest, files, source_uri, revision):
            return
        records = [state / f"shard-{i}-{digest[:16]}.json" for i in range(spec.count)]
        heads = [read_manifest_head(record) for record in records]
        waiting = [i for i, head in enumerate(heads) if head is None]
        if waiting:
            done = spec.count - len(waiting)
            log.info("shards: %d of %d done; the last one writes the manifest", done, spec.count)
            return
        plan = _read_json(state / "plan.json") or {}
        previous = state / plan["previous"] if plan.get("previous") else None
        _remove_stale(dest, previous, _merged(dest, records))
        try:
            write_manifest_records(
                manifest_path(dest),
                source_uri,
                revision,
                _merged(dest, records),
                boot_id=boot_id(),
                durable=all(head.durable for head in heads if head),
            )
        except OSError as exc:
            raise storage_error(exc, dest) from None
        shutil.rmtree(state, ignore_errors=True)
        log.info("shards: all %d done; manifest written", spec.count)


def _merged(dest: Path, records: list[Path]) -> Iterator[tuple[str, FileRecord]]:
    """Every shard's records in path order (each record file is in path order), each file
    checked to be still the one its shard committed."""
    try:
        for path, record in heapq.merge(*map(manifest_records, records), key=itemgetter(0)):
            if not record_is_intact(dest, path, record):
                raise IntegrityError(
                    f"{dest / path} changed after its shard committed it; rerun that shard"
                )
            yield path, record
    except ValueError:
        raise IntegrityError(
            f"a shard's record under {dest / STATE} is unreadable; rerun the shards"
        ) from None


def _remove_stale(
    dest: Path, previous: Path | None, merged: Iterator[tuple[str, FileRecord]]
) -> None:
    """Remove the files the last complete tree had that the shards' records do not: both in
    path order, walked side by side."""
    if previous is None:
        return
    kept = (path for path, _ in merged)
    current = next(kept, None)
    try:
        for path, _ in manifest_records(previous):
            while current is not None and current < path:
                current = next(kept, None)
            if path == current:
                continue
            target = dest / path
            if inside(dest, target) and target.is_file() and not target.is_symlink():
                target.unlink()
    except ValueError:
        log.warning("shards: the last tree's manifest is unreadable; stale files are kept")


def _read_json(path: Path) -> dict | None:
    try:
        body = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    return body if isinstance(body, dict) else None


def _create(path: Path, body: dict) -> bool:
    """Write ``path`` only if it does not exist, complete or not at all (link, not open)."""
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(6)}")  # pods: all pid 1
    temporary.write_text(json.dumps(body))
    try:
        os.link(temporary, path)
        return True
    except FileExistsError:
        return False
    finally:
        with contextlib.suppress(OSError):
            temporary.unlink()

"""Sharding: K initializer pods (an Indexed Job) fill one destination, each its share, at once.

Every pod lists the source and computes the same partition from the listing alone, so they agree
without talking to each other. The partition balances bytes (largest file first, to the least
loaded shard). Files are never split across shards: a file's checksum covers all of its bytes,
and a file fetched by several pods could only be verified by one of them reading all of it back
from the shared volume, which costs as much as the fetch; the largest file therefore bounds the
largest share, and the log says how far from an even split that leaves each shard.

Under the destination::

    .initializer-shards/plan.json          which listing the shards work from (its digest), K, the
                                           run, the files the last complete tree had
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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from initializers.cache import key_material, material_digest
from initializers.destination import LOCK_NAME, FileLock, inside, storage_error
from initializers.engine import Engine, Outcome, Share
from initializers.errors import IntegrityError, LocalStorageError, UsageError
from initializers.fsutil import atomic_write_bytes
from initializers.manifest import (
    Manifest,
    read_manifest,
    read_manifest_file,
    record_is_intact,
    write_manifest,
)
from initializers.progress import human_bytes
from initializers.sources.base import Listing, RemoteFile

log = logging.getLogger(__name__)

STATE = ".initializer-shards"


@dataclass(frozen=True)
class ShardSpec:
    """This pod's place: shard ``index`` of ``count``, in run ``run`` ("" when not told)."""

    count: int
    index: int
    run: str = ""


def partition(files: list[RemoteFile], count: int) -> list[list[RemoteFile]]:
    """``count`` shares of ``files`` with bytes balanced: each file, largest first, goes to the
    share with the fewest bytes so far (ties: the lowest index). The same listing always gives
    the same shares."""
    shares: list[list[RemoteFile]] = [[] for _ in range(count)]
    loads = [(0, index) for index in range(count)]
    for file in sorted(files, key=lambda f: (-f.size, f.path)):
        load, index = heapq.heappop(loads)
        shares[index].append(file)
        heapq.heappush(loads, (load + max(file.size, 1), index))
    return shares


def sync_shard(
    make_engine: Callable[[Share], Engine],
    dest: Path,
    files: list[RemoteFile],
    revision: str | None,
    source_uri: str,
    spec: ShardSpec,
) -> Outcome:
    """Fetch this pod's share of ``files`` into ``dest``; the last shard to finish writes the
    manifest. Returns this shard's outcome (``up_to_date`` when the tree was already complete)."""
    if _complete(dest, files, source_uri, revision):
        return Outcome(len(files), 0, sum(f.size for f in files), 0, up_to_date=True)
    digest = material_digest(key_material(source_uri, Listing(revision, files), ()))
    state = dest / STATE
    try:
        state.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise storage_error(exc, state) from None
    _join_plan(state, digest, files, spec, dest)
    shares = partition(files, spec.count)
    share = shares[spec.index]
    log.info(
        "shard %d (of %d, from 0): %d of %d files, %s (the largest share %s, an even split %s: "
        "files are not split)",
        spec.index,
        spec.count,
        len(share),
        len(files),
        human_bytes(sum(f.size for f in share)),
        human_bytes(max(sum(f.size for f in s) for s in shares)),
        human_bytes(sum(f.size for f in files) / spec.count),
    )
    record = state / f"shard-{spec.index}-{digest[:16]}.json"
    known = {  # what any shard of any run committed: kept when still intact and current
        path: rec
        for found in sorted(state.glob("shard-*.json"))
        if (earlier := read_manifest_file(found))
        for path, rec in earlier.files.items()
    }
    outcome = make_engine(Share(spec.index, record, known)).sync(share, source_uri, revision)
    _finish(dest, state, digest, files, source_uri, revision, spec)
    return outcome


def _complete(dest: Path, files: list[RemoteFile], source_uri: str, revision: str | None) -> bool:
    """True when the manifest already vouches for exactly ``files`` as they are now."""
    manifest = read_manifest(dest)
    if manifest is None or manifest.source != source_uri or manifest.revision != revision:
        return False
    if set(manifest.files) != {f.path for f in files}:
        return False
    return all(
        (record := manifest.files[f.path]).size == f.size
        and record.version == f.version
        and record_is_intact(dest, f.path, record)
        for f in files
    )


def _join_plan(
    state: Path, digest: str, files: list[RemoteFile], spec: ShardSpec, dest: Path
) -> None:
    """Make sure every shard of this run works from one listing: write the plan if there is
    none (or only an earlier run's), else check this pod's listing against it."""
    plan_path = state / "plan.json"
    previous = read_manifest(dest)
    mine = {
        "digest": digest,
        "shards": spec.count,
        "run": spec.run,
        "files": len(files),
        "bytes": sum(f.size for f in files),
        "created": time.time(),
        "previous": sorted(previous.files) if previous else [],
    }
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
        if plan.get("digest") != digest:
            raise IntegrityError(
                f"the source changed while the shards started: the plan lists "
                f"{plan.get('files')} files ({human_bytes(plan.get('bytes', 0))}), this pod "
                f"{len(files)} ({human_bytes(mine['bytes'])}); no mixed tree is built: rerun "
                f"the job (a new run replaces the plan when SHARD_RUN differs; else remove "
                f"{plan_path})"
            )
        return
    raise LocalStorageError(f"cannot settle the shard plan {plan_path}; check the volume")


def _finish(
    dest: Path,
    state: Path,
    digest: str,
    files: list[RemoteFile],
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
        records = [
            read_manifest_file(state / f"shard-{i}-{digest[:16]}.json") for i in range(spec.count)
        ]
        waiting = [i for i, record in enumerate(records) if record is None]
        if waiting:
            done = spec.count - len(waiting)
            log.info("shards: %d of %d done; the last one writes the manifest", done, spec.count)
            return
        merged = {path: rec for record in records if record for path, rec in record.files.items()}
        damaged = [path for path, rec in merged.items() if not record_is_intact(dest, path, rec)]
        if damaged:
            raise IntegrityError(
                f"{dest / damaged[0]} changed after its shard committed it; rerun that shard"
            )
        plan = _read_json(state / "plan.json") or {}
        for path in sorted(set(plan.get("previous", [])) - set(merged)):
            target = dest / path
            if inside(dest, target) and target.is_file() and not target.is_symlink():
                target.unlink()
        try:
            write_manifest(dest, Manifest(source=source_uri, revision=revision, files=merged))
        except OSError as exc:
            raise storage_error(exc, dest) from None
        shutil.rmtree(state, ignore_errors=True)
        log.info("shards: all %d done; manifest written", spec.count)


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

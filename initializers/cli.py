"""The command-line edge: parse, run the engine, turn failures into exit codes and one line.

This is the only place that prints errors, maps them to exit codes and writes the Kubernetes
termination message, so every entrypoint behaves the same.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path
from types import FrameType
from typing import NoReturn
from urllib.parse import urlsplit, urlunsplit

from initializers.cache import (
    AssetCache,
    entry_name,
    fetch_through_cache,
    key_material,
    prove_read_access,
)
from initializers.config import (
    AssetDefaults,
    Settings,
    all_groups,
    load_settings,
    termination_log_for_bad_settings,
)
from initializers.engine import Engine, Outcome, Share, describe_outcome
from initializers.environment import prepare_native_allocator, variables, write_termination_message
from initializers.errors import (
    ExitCode,
    InitializerError,
    Interrupted,
    NotFoundError,
    UsageError,
)
from initializers.filetable import FileTable
from initializers.interrupts import interrupt_reads
from initializers.logs import RedactSecrets, configure
from initializers.retry import RetryPolicy
from initializers.selection import select
from initializers.shards import ShardSpec, sync_shard
from initializers.sources import open_source
from initializers.sources.base import Listing, RemoteFile, Source
from initializers.unpack import archive_to_unpack, sync_archive

log = logging.getLogger("initializers")


def main_for(defaults: AssetDefaults, argv: list[str] | None = None) -> NoReturn:
    """An entrypoint's whole life: run, then end the process with the exit code.

    It ends without the interpreter's teardown, after flushing the logs and stdio: the native
    client's runtime threads can abort a normal interpreter exit (SIGABRT, exit 134) after all
    work is done and reported (seen with obstore 0.12, the native client before pyreqwest).
    """
    code = run(defaults, argv)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def run(defaults: AssetDefaults, argv: list[str] | None = None) -> int:
    """Run one initializer; returns the process exit code."""
    prog = f"{defaults.kind}-initializer"
    prepare_native_allocator()
    try:
        settings = load_settings(defaults, argv)
    except InitializerError as exc:
        return _fail(
            exc,
            prog,
            termination_log_for_bad_settings(argv, variables()),
            RedactSecrets(()),
            debug=False,
        )
    redactor = configure(settings.log_format, settings.debug, settings.secrets())
    stop = _StopOnSignal()
    try:
        with stop:
            _fetch(settings, stop)
        return ExitCode.OK
    except InitializerError as exc:
        return _fail(exc, prog, settings.termination_log, redactor, settings.debug)
    except Exception as exc:  # a bug: say so plainly, keep the traceback for --debug
        if settings.debug:
            traceback.print_exc()
        failure = InitializerError(
            f"unexpected {type(exc).__name__}: {exc} (rerun with --debug "
            "for a traceback and report it)"
        )
        return _fail(failure, prog, settings.termination_log, redactor, settings.debug)


def _fetch(settings: Settings, stop: _StopOnSignal) -> None:
    retry = settings.retry_policy(stop.event)  # the run's one policy, handed to every part
    source = open_source(settings, retry)
    listing: Listing | None = None
    try:
        listing = _list(source, settings.kind)

        def engine_for(dest: Path, share: Share | None = None) -> Engine:
            return Engine(
                source,
                dest,
                workers=settings.workers,
                label=settings.kind,
                retry=retry,
                progress_interval=settings.progress_interval,
                stop=stop.event,
                share=share,
                durable=settings.durable,
            )

        def choose(files: Iterable[RemoteFile]) -> FileTable:
            return _choose(files, settings, source.describe())

        archive = archive_to_unpack(source, listing.files)
        if archive is not None and settings.shards > 1:
            raise UsageError(
                f"{source.describe()} is one archive, which one pod unpacks: drop SHARDS"
            )
        chosen: Iterable[RemoteFile] = [] if archive else choose(listing.files)
        spec = ShardSpec(settings.shards, settings.shard_index, settings.shard_run)

        recorded = _recorded_uri(settings.storage_uri)

        def fill(dest: Path) -> Outcome:
            if archive is not None:
                return sync_archive(archive, dest, recorded, engine_for, choose, stop.event)
            if spec.count > 1:
                # The byte-balanced partition takes every file at once: not yet on disk.
                files = list(chosen)
                return sync_shard(
                    partial(engine_for, dest), dest, files, listing.revision, recorded, spec
                )
            return engine_for(dest).sync(chosen, recorded, listing.revision)

        stop.engine_running = True
        if settings.cache_dir is None:
            outcome = fill(settings.output)
        else:
            outcome = _through_cache(settings, source, listing, chosen, fill, stop.event, retry)
        log.info("%s", describe_outcome(settings.kind, outcome))
    finally:
        source.close()
        if listing is not None and isinstance(listing.files, FileTable):
            listing.files.scratch.close()  # the run ends with os._exit: no finalizer runs


def _list(source: Source, kind: str) -> Listing:
    """The source's listing (a large one on disk), its unsafe names reported."""
    log.info("%s: listing %s", kind, source.describe())
    listing = source.list()
    for name, why in listing.skipped:
        log.warning("skipped %r: the name %s", name, why)
    if not listing.files and listing.skipped:
        raise NotFoundError(
            f"all {len(listing.skipped)} name(s) under {source.describe()} were skipped "
            "as unsafe (see the warnings above); nothing to fetch — rename those objects"
        )
    return listing


def _recorded_uri(uri: str) -> str:
    """The storage URI as the manifest records it: a URL without its query string and user
    info, which are credentials (a presigned URL's signature, a password)."""
    parts = urlsplit(uri)
    if parts.scheme.lower() not in ("http", "https"):
        return uri
    return urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, "", ""))


def _through_cache(
    settings: Settings,
    source: Source,
    listing: Listing,
    chosen: Iterable[RemoteFile],
    fill: Callable[[Path], Outcome],
    stop: threading.Event,
    retry: RetryPolicy,
) -> Outcome:
    """Fetch into the cache entry for what the listing resolved, then link --output to it;
    only for a caller who can read the source's bytes."""
    assert settings.cache_dir is not None
    shown = source.describe()
    prove_read_access(source, chosen or listing.files, retry)
    located = (settings[o.dest] for group in all_groups() for o in group.rows if o.locates)
    material = key_material(
        " ".join([shown, *(str(where) for where in located if where)]),
        listing,
        (settings.allow_patterns, settings.ignore_patterns, settings.fallback_weights),
    )
    return fetch_through_cache(
        AssetCache(settings.cache_dir),
        entry_name(shown, material),
        settings.output,
        fill,
        shown=shown,
        revision=listing.revision,
        total=sum(f.size for f in chosen or listing.files),
        stop=stop,
        interval=settings.progress_interval,
        shared=settings.shards > 1,  # the shards of one fetch fill the entry together
        stall_limit=10 * settings.timeout,  # a live holder retries within --timeout; 10x: stuck
    )


def _choose(files: Iterable[RemoteFile], settings: Settings, where: str) -> FileTable:
    """The files the allow/ignore patterns and the weights preference keep, with the reasons
    logged; NotFoundError when none is left."""
    chosen = select(
        files,
        settings.allow_patterns,
        settings.ignore_patterns,
        fallback_weights=settings.fallback_weights,
        patterns_are_default=settings.patterns_are_default,
    )
    if chosen.weights_note:
        log.info("%s", chosen.weights_note)
    for path in chosen.conflicts:
        log.warning("skipped %r: another key uses it as a folder", path)
    if chosen.filtered_count:
        shown = ", ".join(chosen.filtered_out)
        more = chosen.filtered_count - len(chosen.filtered_out)
        log.info(
            "%d file(s) left out by the allow/ignore patterns: %s%s",
            chosen.filtered_count,
            shown,
            f" and {more} more" if more else "",
        )
    if not chosen.files:
        raise NotFoundError(
            f"none of the {len(files)} file(s) under {where} match the allow/ignore patterns; "
            "adjust ALLOW_PATTERNS / IGNORE_PATTERNS"
        )
    return chosen.files


class _StopOnSignal:
    """SIGTERM/SIGINT: stop the engine at once — reads in flight are cut — leaving it resumable."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.engine_running = False
        self._previous: dict[int, object] = {}

    def __enter__(self) -> _StopOnSignal:
        for signum in (signal.SIGTERM, signal.SIGINT):
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.event.is_set():
            return
        # The stop first: the log line can fail, when the signal lands while this thread is
        # mid-write to stderr ("reentrant call"), and a stop lost there left a run waiting.
        self.event.set()
        if self.engine_running:
            interrupt_reads()  # a worker blocked on a stalled server sees the stop now
        with contextlib.suppress(RuntimeError):
            log.warning("%s received: stopping; a rerun resumes where this one stopped", name)
        if not self.engine_running:
            raise Interrupted(f"stopped by {name} before fetching started")


def _fail(
    exc: InitializerError, kind: str, termination_log: Path, redactor: RedactSecrets, debug: bool
) -> int:
    message = redactor.redact(" ".join(str(exc).split()))
    if debug:
        traceback.print_exception(exc)
    print(f"{kind}: error: {message}", file=sys.stderr, flush=True)
    write_termination_message(message, termination_log)
    return int(exc.exit_code)

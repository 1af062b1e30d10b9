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
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from pathlib import Path
from types import FrameType
from typing import NoReturn
from urllib.parse import urlsplit, urlunsplit

from initializers.cache import (
    AssetCache,
    asset_material,
    entry_name,
    fetch_through_cache,
    key_material,
    material_digest,
    prove_read_access,
)
from initializers.config import (
    AssetDefaults,
    Settings,
    all_groups,
    load_settings,
    termination_log_for_bad_settings,
)
from initializers.dryrun import Printer, plan_folder
from initializers.engine import Engine, Outcome, Share, describe_outcome
from initializers.environment import variables, write_termination_message
from initializers.errors import (
    ExitCode,
    InitializerError,
    Interrupted,
    UsageError,
)
from initializers.filetable import FileTable, as_table
from initializers.interrupts import interrupt_reads
from initializers.logs import RedactSecrets, configure
from initializers.patterns import is_selected
from initializers.retry import RetryPolicy
from initializers.selection import Chooser, Rules
from initializers.shards import ShardSpec, sync_shard
from initializers.shards import share as shard_share
from initializers.sources import open_source
from initializers.sources.base import Listing, RemoteFile, Source
from initializers.unpack import sync_layers

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
        run = _Run(settings, source, listing, stop.event, retry)
        if settings.dry_run:
            run.list_whole()
            _dry_run(settings, source, run)
            return
        with stop.engine():
            outcome = run.linked_unchanged()
        if outcome is None:
            run.list_whole()
            stop.engine_running = True
            if settings.cache_dir is None:
                outcome = run.fill(settings.output)
            else:
                chosen = run.chosen
                assert chosen is not None
                outcome = _through_cache(
                    settings, source, listing, chosen, run.fill, stop.event, retry
                )
        log.info("%s", describe_outcome(settings.kind, outcome))
    finally:
        source.close()
        if listing is not None and isinstance(listing.files, FileTable):
            listing.files.scratch.close()  # the run ends with os._exit: no finalizer runs


class _Run:
    """How a listing is fetched into a folder: unpacked (an archive, an image's layers), by
    shards, or by one engine, streaming unless something needs the whole listing first."""

    def __init__(
        self,
        settings: Settings,
        source: Source,
        listing: Listing,
        stop: threading.Event,
        retry: RetryPolicy,
    ) -> None:
        self.settings, self.source, self.listing = settings, source, listing
        self.stop, self.retry = stop, retry
        self.where = source.describe()
        self.rules = Rules(
            settings.allow_patterns,
            settings.ignore_patterns,
            settings.fallback_weights,
            settings.patterns_are_default,
        )
        self.layered = source.layered(listing)
        if self.layered is not None and settings.shards > 1:
            raise UsageError(f"{self.where} is unpacked, which one pod does: drop SHARDS")
        self.spec = ShardSpec(settings.shards, settings.shard_index, settings.shard_run)
        self.whole = self.spec.count > 1 or settings.cache_dir is not None
        self.chosen: Iterable[RemoteFile] | None = None
        self.recorded = _recorded_uri(settings.storage_uri)

    def list_whole(self) -> None:
        """List now what needs the whole listing before the first file: the byte-balanced
        shard plan, the asset store's key, the weight-format fallback. Anything else streams."""
        if self.layered or self.whole or self.rules.needs_whole_listing:
            self.listing.complete()
        if self.layered is not None:
            self.chosen = []
        elif self.whole:
            self.chosen = _choose(self.listing, self.rules, self.where)

    def linked_unchanged(self) -> Outcome | None:
        """A TrainJob after the first on a listing of more than a page: the asset store's
        latest entry of this asset, linked once its key ranges, listed in parallel, prove it
        is what the source holds now (:mod:`initializers.unchanged`), with no whole listing
        and no plan. None where that is not proven or does not apply: the entry is then named
        by the whole listing. A file's version (ETag, generation) changes with its checksum,
        so an entry whose every path, size and version is listed again is the one the whole
        listing would name."""
        settings, listing, rules = self.settings, self.listing, self.rules
        if (
            settings.cache_dir is None
            or listing.rest is None
            or self.layered is not None
            or self.spec.count > 1
            or rules.needs_whole_listing
            or self.source.pages_after(None) is None
        ):
            return None
        cache = AssetCache(settings.cache_dir)
        identity = material_digest(_asset(settings, self.source, listing.revision))
        latest = cache.latest(identity)
        readable = [f for f in listing.files if is_selected(f.path, rules.allow, rules.ignore)]
        if latest is None or not any(f.size for f in readable):
            return None  # no entry to check, or no byte on the first page to prove access with
        name, size = latest
        prove_read_access(self.source, readable, self.retry)
        chooser = Chooser(listing, rules, self.where)

        def check(entry: Path) -> Outcome | None:
            return self.engine_for(entry).proven_unchanged(chooser, self.recorded, listing.revision)

        linked = fetch_through_cache(
            cache,
            name,
            settings.output,
            check,
            shown=self.where,
            revision=listing.revision,
            identity=identity,
            total=size,
            stop=self.stop,
            interval=settings.progress_interval,
            stall_limit=10 * settings.timeout,
            existing=True,
        )
        if linked is None:
            log.info("cache: listing %s whole to name the entry it needs", self.where)
        return linked

    def engine_for(self, dest: Path, share: Share | None = None) -> Engine:
        return Engine(
            self.source,
            dest,
            workers=self.settings.workers,
            label=self.settings.kind,
            retry=self.retry,
            progress_interval=self.settings.progress_interval,
            stop=self.stop,
            share=share,
            durable=self.settings.durable,
        )

    def choose(self, files: Iterable[RemoteFile]) -> FileTable:
        return _choose(Listing(None, as_table(files)), self.rules, self.where)

    def fill(self, dest: Path) -> Outcome:
        revision = self.listing.revision
        if self.layered is not None:
            return sync_layers(
                self.layered,
                dest,
                self.recorded,
                self.engine_for,
                self.choose,
                self.stop,
                self.settings.durable,
            )
        if self.chosen is None:
            chooser = Chooser(self.listing, self.rules, self.where)
            return self.engine_for(dest).sync(chooser, self.recorded, revision)
        if self.spec.count > 1:
            engine = partial(self.engine_for, dest)
            chosen = as_table(self.chosen)
            return sync_shard(engine, dest, chosen, revision, self.recorded, self.spec)
        return self.engine_for(dest).sync(self.chosen, self.recorded, revision)


def _list(source: Source, kind: str) -> Listing:
    """The source's listing: its first page, and the rest on demand."""
    log.info("%s: listing %s", kind, source.describe())
    return source.list()


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
    outcome = fetch_through_cache(
        AssetCache(settings.cache_dir),
        _entry_name(settings, source, listing),
        settings.output,
        fill,
        shown=shown,
        revision=listing.revision,
        identity=material_digest(_asset(settings, source, listing.revision)),
        total=sum(f.size for f in chosen or listing.files),
        stop=stop,
        interval=settings.progress_interval,
        shared=settings.shards > 1,  # the shards of one fetch fill the entry together
        stall_limit=10 * settings.timeout,  # a live holder retries within --timeout; 10x: stuck
    )
    assert outcome is not None  # the engine's fill always gives one
    return outcome


def _asset(settings: Settings, source: Source, revision: str | None) -> dict[str, object]:
    """The asset store's material for this asset whatever its files: the source and where it
    is, the revision, how files are chosen (:func:`~initializers.cache.asset_material`)."""
    located = (settings[o.dest] for group in all_groups() for o in group.rows if o.locates)
    return asset_material(
        " ".join([source.describe(), *(str(where) for where in located if where)]),
        revision,
        (settings.allow_patterns, settings.ignore_patterns, settings.fallback_weights),
    )


def _entry_name(settings: Settings, source: Source, listing: Listing) -> str:
    """The asset store's entry for what the listing resolved, and how it was chosen."""
    material = key_material(_asset(settings, source, listing.revision), listing.files)
    return entry_name(source.describe(), material)


def _dry_run(settings: Settings, source: Source, run: _Run) -> None:
    """What a run would do (:mod:`initializers.dryrun`), for each way a run goes."""
    printer = Printer(settings.log_format == "json")
    dest, notes = settings.output, []
    revision, kind = run.listing.revision, settings.kind
    if run.layered is not None:
        for blob in run.layered.blobs:
            printer.file("fetch", blob.path, blob.size)
        notes.append("a run fetches these and unpacks them; what they hold is known only then")
    elif settings.cache_dir is not None:
        name = _entry_name(settings, source, run.listing)
        dest = AssetCache(settings.cache_dir).entries_dir / name
        made = "exists" if dest.exists() else "does not exist yet"
        notes.append(f"the asset store's entry {name} {made}; {settings.output} would link to it")
        plan_folder(printer, dest, run.chosen or [], run.recorded, revision, kind)
    elif run.spec.count > 1:
        chosen = as_table(run.chosen or [])
        mine, _ = shard_share(chosen, run.spec)
        notes.append(
            f"shard {run.spec.index} (of {run.spec.count}) takes {len(mine)} of {len(chosen)} "
            "files; the plan below is its share"
        )
        plan_folder(printer, dest, mine, run.recorded, revision, kind)
    else:
        chooser = Chooser(run.listing, run.rules, run.where)
        plan_folder(printer, dest, chooser, run.recorded, revision, kind)
    printer.summary(dest, notes)


def _choose(listing: Listing, rules: Rules, where: str) -> FileTable:
    """The files of a complete listing the rules keep, with the reasons logged; NotFoundError
    when none is left."""
    chooser = Chooser(listing, rules, where)
    chosen = chooser.chosen_table()
    chooser.report()
    return chosen


class _StopOnSignal:
    """SIGTERM/SIGINT: stop the engine at once — reads in flight are cut — leaving it resumable."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.engine_running = False
        self.received = ""  # the signal's name
        self._previous: dict[int, object] = {}

    @contextlib.contextmanager
    def engine(self) -> Iterator[None]:
        """While an engine runs its part: a signal stops it (every read in flight cut) rather
        than raising wherever the main thread is. One that came meanwhile raises on the way
        out, for a part that ended on its own."""
        self.engine_running = True
        try:
            yield
        finally:
            self.engine_running = False
        if self.event.is_set():
            raise Interrupted(f"stopped by {self.received} before fetching started")

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
        self.received = name
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

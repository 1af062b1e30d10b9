"""The run's settings: the common option rows, and every source's own, read once.

The common rows are declared here; each scheme declares its own beside its source (the
registry in :mod:`initializers.sources` names them), and :mod:`initializers.options` derives the
parsing, ``--help``, the secrets and the docs from the rows. A source is handed only the common
options and its own (:meth:`Settings.for_source`). Unset variables keep the asset's defaults
(the upstream loader wiped them), and nothing here ever writes to the environment.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from initializers.environment import DEFAULT_TERMINATION_LOG, parse_bool, variables
from initializers.errors import UsageError
from initializers.inflight import connections_for
from initializers.options import (
    Option,
    OptionGroup,
    SourceSettings,
    Values,
    add_flags,
    non_negative_int,
    one_of,
    positive_float,
    positive_int,
    resolve,
)
from initializers.patterns import parse_patterns
from initializers.retry import RetryPolicy
from initializers.sources import option_groups

MAX_URI_LENGTH = 2048


@dataclass(frozen=True)
class AssetDefaults:
    """What distinguishes the dataset initializer from the model initializer."""

    kind: str  # "dataset" or "model"
    output: Path
    allow_patterns: tuple[str, ...] = ()
    ignore_patterns: tuple[str, ...] = ()
    # Weight files to fall back to when the source holds no *.safetensors (model only).
    fallback_weights: tuple[str, ...] = ()


COMMON = OptionGroup(
    "",
    "every source",
    (
        Option(
            "storage_uri",
            "--storage-uri",
            ("STORAGE_URI",),
            "what to fetch: hf://[datasets/]org/repo[@revision][/path], s3://bucket/prefix, "
            "gs://bucket/prefix, az://container/prefix, https://host/file[.tar.gz|.zip] (a "
            "#sha256=<hex> fragment pins its content), file:///folder, "
            "oci://registry/repository:tag or @sha256:<digest>[/path]",
            shown="(required)",
        ),
        Option("output", "--output", ("OUTPUT_PATH",), "destination folder", Path),
        Option(
            "cache_dir",
            "--cache-dir",
            ("CACHE_DIR",),
            "shared asset store (a ReadWriteMany volume, mounted at the same path in the "
            "trainer nodes): fetch once into it, then make --output a link to the entry",
            Path,
            shown="(off)",
        ),
        Option(
            "allow_patterns",
            "--allow-patterns",
            ("ALLOW_PATTERNS",),
            "comma-separated globs on the path under --output; only matches are fetched",
        ),
        Option(
            "ignore_patterns",
            "--ignore-patterns",
            ("IGNORE_PATTERNS",),
            "comma-separated globs on the path under --output; matches are skipped",
        ),
        Option(
            "workers",
            "--workers",
            ("WORKERS",),
            "parallel requests; files up to 1 MiB: 3x as many (each mostly waits for its first "
            "byte), and 4x, at most 32 a process, from S3 and the Hub (on the native loop, "
            "where they cost no thread)",
            positive_int,
            default=16,
        ),
        Option(
            "shards",
            "--shards",
            ("SHARDS",),
            "pods sharing this fetch (an Indexed Job's parallelism); each fetches its share of "
            "the files into the same --output (a ReadWriteMany volume)",
            positive_int,
            shown="1",
        ),
        Option(
            "shard_index",
            "--shard-index",
            ("SHARD_INDEX", "JOB_COMPLETION_INDEX"),
            "this pod's share, 0 to SHARDS-1 (Kubernetes sets JOB_COMPLETION_INDEX)",
            non_negative_int,
        ),
        Option(
            "shard_run",
            None,
            ("SHARD_RUN",),
            "one run of a sharded fetch (the runtimes set the Job's UID): a new run replaces "
            "the plan an earlier, failed run left",
            default="",
        ),
        Option(
            "anonymous",
            "--anonymous",
            ("ANONYMOUS",),
            "unsigned requests (public S3 and GCS buckets)",
            parse_bool,
            default=False,
            switch=True,
        ),
        Option(
            "dry_run",
            "--dry-run",
            ("DRY_RUN",),
            "list and plan as a run would, print each file (fetch, keep, remove) and the "
            "totals, and write nothing at all",
            parse_bool,
            default=False,
            switch=True,
        ),
        Option(
            "durable",
            "--durable",
            ("DURABLE",),
            "wait for the disk: every file and folder synced before the manifest, so exit 0 "
            "means on stable storage (at the disk's pace). Off: the kernel writes back after "
            "exit, as for every peer; a later run checks the bytes of files a crash may have "
            "lost (written unsynced before the last boot) against their digests before it "
            "trusts them",
            parse_bool,
            default=False,
            switch=True,
        ),
        Option(
            "ca_bundle",
            "--ca-bundle",
            ("AWS_CA_BUNDLE", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE"),
            "PEM bundle of trusted CAs for HTTPS endpoints",
            shown="system CAs",
        ),
        Option(
            "log_format",
            "--log-format",
            ("LOG_FORMAT",),
            "text or json (one object per line)",
            one_of("text", "json"),
            default="text",
        ),
        Option(
            "progress_interval",
            "--progress-interval",
            ("PROGRESS_INTERVAL",),
            "seconds between progress lines",
            positive_float,
            default=5.0,
        ),
        Option(
            "timeout",
            "--timeout",
            ("TIMEOUT",),
            "seconds a request may stall before it is retried",
            positive_float,
            default=60.0,
        ),
        Option(
            "retries",
            "--retries",
            ("RETRIES",),
            "attempts in a row per request on transient errors, within 5 minutes; an attempt "
            "that got 1 MiB further starts the count again; a Retry-After the server sends is "
            "waited instead of the backoff",
            positive_int,
            default=8,
        ),
        Option(
            "termination_log",
            "--termination-log",
            ("TERMINATION_LOG",),
            "where the one-line failure reason goes",
            Path,
            default=DEFAULT_TERMINATION_LOG,
        ),
        Option(
            "debug",
            "--debug",
            ("DEBUG",),
            "log every step and show tracebacks",
            parse_bool,
            default=False,
            switch=True,
        ),
    ),
    library_env=(("HTTPS_PROXY, HTTP_PROXY, NO_PROXY", "HTTP(S) proxy for every source"),),
)


def all_groups() -> list[OptionGroup]:
    """The common options, then each scheme's own."""
    return [COMMON, *option_groups()]


class Settings(Values):
    """Everything one initializer run was given; built once by :func:`load_settings`."""

    def for_source(self, own: OptionGroup | None, retry: RetryPolicy) -> SourceSettings:
        """What a source may see: the common options, its own, the run's retry policy and the
        engine's connection count; never another source's credentials."""
        names = {o.dest for o in COMMON.rows} | {o.dest for o in (own.rows if own else ())}
        names |= {"kind", "patterns_are_default", "fallback_weights"}
        values = {name: value for name, value in self.items() if name in names}
        secret = (name for name in self._secret if name in names)
        return SourceSettings(values, secret, retry, connections_for(self["workers"]))

    def retry_policy(self, stop: threading.Event | None = None) -> RetryPolicy:
        """The run's one retry policy; its backoff sleeps end early once ``stop`` is set."""
        return RetryPolicy(attempts=self["retries"], sleep=stop.wait if stop else time.sleep)


class _ArgumentParser(argparse.ArgumentParser):
    """argparse that raises UsageError instead of printing usage and exiting."""

    def error(self, message: str) -> None:  # type: ignore[override]
        prefix = "unrecognized arguments: "
        if message.startswith(prefix):  # name the flags, never echo values (one may be a secret)
            flags = [a.split("=", 1)[0] for a in message[len(prefix) :].split() if a[:1] == "-"]
            message = prefix + (" ".join(flags) or "(values without a flag)")
        raise UsageError(f"{message} (see --help)")


def _environment_only_help(groups: list[OptionGroup]) -> str:
    """The settings that have no flag (credentials, endpoints), wrapped for a terminal."""
    rows = []
    for group in groups:
        for option in group.rows:
            if option.flag is None:
                shown = option.default_text()
                note = f" (default: {shown})" if shown and option.default is None else ""
                rows.append((", ".join(option.env), option.help + note))
    rows += [row for group in groups for row in group.library_env]
    lines = ["environment only:"]
    for names, text in rows:
        lines.append(f"  {names}")
        lines.extend(textwrap.wrap(text, 78, initial_indent="      ", subsequent_indent="      "))
    return "\n".join(lines)


def asset_defaults_shown(defaults: AssetDefaults) -> dict[str, str]:
    """How ``--help`` shows the defaults that differ between the dataset and the model."""
    return {
        "output": str(defaults.output),
        "allow_patterns": ",".join(defaults.allow_patterns) or "everything",
        "ignore_patterns": ",".join(defaults.ignore_patterns) or "nothing",
    }


def build_parser(defaults: AssetDefaults) -> argparse.ArgumentParser:
    groups = all_groups()
    parser = _ArgumentParser(
        prog=f"{defaults.kind}-initializer",
        allow_abbrev=False,  # "--token x" must not silently mean "--token-file x"
        description=textwrap.fill(
            f"Fetch a {defaults.kind} from Hugging Face (hf://), S3 (s3://), GCS (gs://), Azure "
            "Blob (az://), a URL (https://, archives unpacked) or a mounted folder (file://) "
            "into a folder: parallel, resumable, verified, with a completion manifest. Every "
            "flag can also be set by the environment variable shown; flags win.",
            80,
        ),
        epilog=_environment_only_help(groups)
        + "\n\n"
        + textwrap.fill(
            "Secrets (keys, tokens, SAS, connection strings, client secrets, HTTP headers) are "
            "read only from the environment or from a file (--secret-access-key-file, "
            "--token-file), never from flags. Exit codes: 0 ok, 1 unexpected, 2 usage, 3 auth, "
            "4 not found, 5 integrity, 6 local storage, 7 remote unavailable.",
            80,
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    shown = asset_defaults_shown(defaults)
    for group in groups:
        add_flags(parser, group.rows, shown)
    return parser


def termination_log_for_bad_settings(argv: list[str] | None, env: Mapping[str, str]) -> Path:
    """Where to report a failure of :func:`load_settings` itself: the --termination-log flag or
    TERMINATION_LOG if given (read tolerantly, ignoring everything else), else the default."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    option = next(o for o in COMMON.rows if o.dest == "termination_log")
    parser.add_argument(option.flag, dest=option.dest, default=None)  # type: ignore[arg-type]
    known, _ = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    try:
        return resolve(option, known, env)
    except UsageError:
        return DEFAULT_TERMINATION_LOG


def load_settings(
    defaults: AssetDefaults, argv: list[str] | None, env: Mapping[str, str] | None = None
) -> Settings:
    """Parse flags and environment into :class:`Settings`, or raise UsageError."""
    env = variables() if env is None else env
    flags = build_parser(defaults).parse_args(argv)
    groups = all_groups()
    values = {o.dest: resolve(o, flags, env) for group in groups for o in group.rows}
    _check_common(values)
    for group in groups:
        if group.finish is not None:
            group.finish(values)
    allow, ignore = values["allow_patterns"], values["ignore_patterns"]
    values.update(
        kind=defaults.kind,
        output=values["output"] or defaults.output,
        allow_patterns=parse_patterns(allow, "allow") if allow else defaults.allow_patterns,
        ignore_patterns=parse_patterns(ignore, "ignore") if ignore else defaults.ignore_patterns,
        patterns_are_default=not allow
        and (not ignore or parse_patterns(ignore, "ignore") == defaults.ignore_patterns),
        fallback_weights=defaults.fallback_weights,
    )
    secret = [o.dest for group in groups for o in group.rows if o.secret]
    return Settings(values, secret)


def _check_common(values: dict[str, Any]) -> None:
    """The storage URI is given and not absurd; a shard knows its index."""
    uri = values["storage_uri"]
    if not uri:
        raise UsageError(
            "no source given: pass --storage-uri or set STORAGE_URI "
            "(e.g. hf://org/repo or s3://bucket/prefix)"
        )
    if len(uri) > MAX_URI_LENGTH:
        raise UsageError(f"the storage URI is {len(uri)} characters; at most {MAX_URI_LENGTH}")
    shards, shard_index = values["shards"], values["shard_index"]
    if shards and shard_index is None:
        raise UsageError(
            "--shards needs this pod's index: --shard-index or JOB_COMPLETION_INDEX "
            "(Kubernetes sets it in an Indexed Job)"
        )
    shards = shards or 1
    if shards > 1 and shard_index >= shards:
        raise UsageError(f"shard index {shard_index} is not below SHARDS={shards}")
    values["shards"] = shards
    values["shard_index"] = (shard_index or 0) if shards > 1 else 0

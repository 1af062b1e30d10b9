"""Settings: one declarative table of options, read from flags first and the environment second.

Each option names its flag and the environment variables that may carry it (the Kubeflow names
first, then the ecosystem's), so ``--help`` documents both and nothing else in the package reads
``os.environ`` for configuration. Unset variables keep the asset's defaults (the upstream loader
wiped them), and nothing here ever writes to the environment.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import textwrap
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from initializers.errors import UsageError
from initializers.patterns import parse_patterns

# A request for a small body spends most of its life waiting for the first byte (S3 and CDNs take
# 10-50 ms; the body itself is a millisecond at 1 GB/s), so small files keep this many times the
# workers' requests in flight while large ranges stay at ``workers`` (more of those only slowed
# the S3 model); the HTTP transports pool a connection for each. Throwaway paired rounds against
# s5cmd on the benchmark's S3 dataset with 20 ms before every first byte (5 rounds each, a quiet
# machine): ours 3.5-3.8 s at 1x, 2.5-2.9 s at 2x or 3x (median ratio 0.46 -> 0.60, 0.63);
# without the delay 3x cost ~5% (0.70 -> 0.66). On the Hub dataset (read ahead natively too) 3x
# against 1x: 0.83 -> 0.90 with the delay, 0.86 -> 0.83 without.
SMALL_IN_FLIGHT = 3

_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # an RFC 9110 token

MAX_URI_LENGTH = 2048
_AZURE_FIELDS = (
    "azure_account",
    "azure_key",
    "azure_sas",
    "azure_connection_string",
    "azure_client_id",
    "azure_tenant_id",
    "azure_client_secret",
    "azure_federated_token_file",
    "azure_authority",
)
DEFAULT_TERMINATION_LOG = Path("/dev/termination-log")


@dataclass(frozen=True)
class AssetDefaults:
    """What distinguishes the dataset initializer from the model initializer."""

    kind: str  # "dataset" or "model"
    output: Path
    allow_patterns: tuple[str, ...] = ()
    ignore_patterns: tuple[str, ...] = ()
    # Weight files to fall back to when the source holds no *.safetensors (model only).
    fallback_weights: tuple[str, ...] = ()


@dataclass(frozen=True)
class Settings:
    """Everything one initializer run needs; built once by :func:`load_settings`."""

    kind: str
    storage_uri: str
    output: Path
    revision: str | None
    allow_patterns: tuple[str, ...]
    ignore_patterns: tuple[str, ...]
    patterns_are_default: bool
    fallback_weights: tuple[str, ...]
    workers: int
    endpoint: str | None
    hf_endpoint: str | None
    region: str
    role_arn: str | None
    anonymous: bool
    access_key_id: str | None = field(default=None, repr=False)
    secret_access_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)
    http_headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    gcs_key_json: str | None = field(default=None, repr=False)
    azure_account: str | None = None
    azure_key: str | None = field(default=None, repr=False)
    azure_sas: str | None = field(default=None, repr=False)
    azure_connection_string: str | None = field(default=None, repr=False)
    azure_client_id: str | None = None
    azure_tenant_id: str | None = None
    azure_client_secret: str | None = field(default=None, repr=False)
    azure_federated_token_file: Path | None = None
    azure_authority: str | None = None
    ca_bundle: str | None = None
    cache_dir: Path | None = None
    shards: int = 1
    shard_index: int = 0
    shard_run: str = ""
    log_format: str = "text"
    progress_interval: float = 5.0
    timeout: float = 60.0
    retries: int = 8
    termination_log: Path = DEFAULT_TERMINATION_LOG
    debug: bool = False

    def secrets(self) -> list[str]:
        """Values that must never appear in any output."""
        fixed = (
            self.secret_access_key,
            self.session_token,
            self.token,
            self.gcs_key_json,
            self.azure_key,
            self.azure_sas,
            self.azure_connection_string,
            self.azure_client_secret,
        )
        return [s for s in (*fixed, *(value for _, value in self.http_headers)) if s]


def _bool(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"expected true/false, got {value!r}")


def _headers(value: str) -> tuple[tuple[str, str], ...]:
    """A JSON object of header names to string values (never echoed: they hold secrets)."""
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError:
        raise ValueError('expected a JSON object such as {"Authorization": "Bearer ..."}') from None
    if not isinstance(parsed, dict) or not all(
        isinstance(k, str) and _HEADER_NAME.match(k) and isinstance(v, str) and "\n" not in v
        for k, v in parsed.items()
    ):
        raise ValueError("expected a JSON object of header names to one-line string values")
    return tuple(parsed.items())


def _positive_int(value: str) -> int:
    number = int(value)
    if number < 1:
        raise ValueError("must be at least 1")
    return number


def _non_negative_int(value: str) -> int:
    number = int(value)
    if number < 0:
        raise ValueError("must be 0 or more")
    return number


def _positive_float(value: str) -> float:
    number = float(value)
    if number <= 0:
        raise ValueError("must be greater than 0")
    return number


def _log_format(value: str) -> str:
    if value not in ("text", "json"):
        raise ValueError("must be 'text' or 'json'")
    return value


@dataclass(frozen=True)
class Option:
    """One setting: its flag, the env vars that may carry it, and how to parse it."""

    dest: str
    flag: str | None
    env: tuple[str, ...]
    help: str
    parse: Callable[[str], Any] = str
    is_switch: bool = False


OPTIONS: tuple[Option, ...] = (
    Option(
        "storage_uri",
        "--storage-uri",
        ("STORAGE_URI",),
        "what to fetch: hf://[datasets/]org/repo[@revision][/path], s3://bucket/prefix, "
        "gs://bucket/prefix, az://container/prefix, https://host/file[.tar.gz|.zip] (a "
        "#sha256=<hex> fragment pins its content), file:///folder",
    ),
    Option("output", "--output", ("OUTPUT_PATH",), "destination folder", Path),
    Option(
        "cache_dir",
        "--cache-dir",
        ("CACHE_DIR",),
        "shared asset store (a ReadWriteMany volume, mounted at the same path in the trainer "
        "nodes): fetch once into it, then make --output a link to the entry",
        Path,
    ),
    Option(
        "revision",
        "--revision",
        ("REVISION",),
        "Hub branch, tag or commit (overrides @rev in the URI)",
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
        "parallel requests (default 16; files up to 1 MiB: 3x as many, and 4x, at most 32 a "
        "process, from S3 and the Hub)",
        _positive_int,
    ),
    Option(
        "shards",
        "--shards",
        ("SHARDS",),
        "pods sharing this fetch (an Indexed Job's parallelism); each fetches its share of the "
        "files into the same --output (a ReadWriteMany volume)",
        _positive_int,
    ),
    Option(
        "shard_index",
        "--shard-index",
        ("SHARD_INDEX", "JOB_COMPLETION_INDEX"),
        "this pod's share, 0 to SHARDS-1 (Kubernetes sets JOB_COMPLETION_INDEX)",
        _non_negative_int,
    ),
    Option(
        "shard_run",
        None,
        ("SHARD_RUN",),
        "one run of a sharded fetch (the runtimes set the Job's UID): a new run replaces the "
        "plan an earlier, failed run left",
    ),
    Option(
        "endpoint",
        "--endpoint",
        ("ENDPOINT", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"),
        "S3-compatible endpoint URL (MinIO, R2, Ceph, ...)",
    ),
    Option("hf_endpoint", None, ("HF_ENDPOINT",), "Hugging Face Hub endpoint or mirror"),
    Option(
        "region",
        "--region",
        ("REGION", "AWS_REGION", "AWS_DEFAULT_REGION"),
        "S3 region; 'auto' asks the bucket (default auto)",
    ),
    Option(
        "role_arn", "--role-arn", ("ROLE_ARN",), "IAM role to assume through STS before fetching"
    ),
    Option(
        "anonymous",
        "--anonymous",
        ("ANONYMOUS",),
        "unsigned requests (public S3 and GCS buckets)",
        _bool,
        is_switch=True,
    ),
    Option("access_key_id", None, ("ACCESS_KEY_ID", "AWS_ACCESS_KEY_ID"), "S3 access key id"),
    Option(
        "secret_access_key", None, ("SECRET_ACCESS_KEY", "AWS_SECRET_ACCESS_KEY"), "S3 secret key"
    ),
    Option(
        "secret_access_key_file",
        "--secret-access-key-file",
        ("SECRET_ACCESS_KEY_FILE",),
        "file holding the S3 secret key",
        Path,
    ),
    Option("session_token", None, ("SESSION_TOKEN", "AWS_SESSION_TOKEN"), "S3 session token"),
    Option("token", None, ("ACCESS_TOKEN", "HF_TOKEN"), "Hugging Face token"),
    Option(
        "gcs_key_json",
        None,
        ("GOOGLE_APPLICATION_CREDENTIALS_JSON",),
        "a GCS service account key's JSON itself (e.g. from a secretRef); "
        "GOOGLE_APPLICATION_CREDENTIALS names a key file",
    ),
    Option(
        "azure_account",
        None,
        ("AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_ACCOUNT"),
        "Azure storage account of az:// URIs",
    ),
    Option(
        "azure_key",
        None,
        ("AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_ACCESS_KEY", "AZURE_STORAGE_KEY"),
        "Azure storage account key",
    ),
    Option("azure_sas", None, ("AZURE_STORAGE_SAS_TOKEN",), "Azure SAS token"),
    Option(
        "azure_connection_string",
        None,
        ("AZURE_STORAGE_CONNECTION_STRING",),
        "Azure storage connection string (account, key or SAS, endpoint)",
    ),
    Option(
        "azure_client_id",
        None,
        ("AZURE_CLIENT_ID", "AZ_CLIENT_ID"),
        "Azure service principal or workload identity client id",
    ),
    Option("azure_tenant_id", None, ("AZURE_TENANT_ID", "AZ_TENANT_ID"), "Azure tenant id"),
    Option(
        "azure_client_secret",
        None,
        ("AZURE_CLIENT_SECRET", "AZ_CLIENT_SECRET"),
        "Azure service principal secret",
    ),
    Option(
        "azure_federated_token_file",
        None,
        ("AZURE_FEDERATED_TOKEN_FILE",),
        "AKS workload identity token file",
        Path,
    ),
    Option(
        "azure_authority",
        None,
        ("AZURE_AUTHORITY_HOST",),
        "Microsoft Entra authority (default https://login.microsoftonline.com)",
    ),
    Option(
        "http_headers",
        None,
        ("HTTP_HEADERS",),
        "JSON object of request headers for http(s):// URIs, e.g. an Authorization header "
        "(never logged; not sent on to another host after a redirect)",
        _headers,
    ),
    Option(
        "token_file",
        "--token-file",
        ("ACCESS_TOKEN_FILE", "HF_TOKEN_PATH"),
        "file holding the Hugging Face token",
        Path,
    ),
    Option(
        "ca_bundle",
        "--ca-bundle",
        ("AWS_CA_BUNDLE", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE"),
        "PEM bundle of trusted CAs for HTTPS endpoints",
    ),
    Option(
        "log_format", "--log-format", ("LOG_FORMAT",), "text or json (default text)", _log_format
    ),
    Option(
        "progress_interval",
        "--progress-interval",
        ("PROGRESS_INTERVAL",),
        "seconds between progress lines (default 5)",
        _positive_float,
    ),
    Option(
        "timeout",
        "--timeout",
        ("TIMEOUT",),
        "seconds a request may stall before it is retried (default 60)",
        _positive_float,
    ),
    Option(
        "retries",
        "--retries",
        ("RETRIES",),
        "attempts in a row per request on transient errors, within 5 minutes; an attempt that got "
        "1 MiB further starts the count again (default 8)",
        _positive_int,
    ),
    Option(
        "termination_log",
        "--termination-log",
        ("TERMINATION_LOG",),
        "where the one-line failure reason goes (default /dev/termination-log)",
        Path,
    ),
    Option(
        "debug", "--debug", ("DEBUG",), "log every step and show tracebacks", _bool, is_switch=True
    ),
)


class _ArgumentParser(argparse.ArgumentParser):
    """argparse that raises UsageError instead of printing usage and exiting."""

    def error(self, message: str) -> None:  # type: ignore[override]
        prefix = "unrecognized arguments: "
        if message.startswith(prefix):  # name the flags, never echo values (one may be a secret)
            flags = [a.split("=", 1)[0] for a in message[len(prefix) :].split() if a[:1] == "-"]
            message = prefix + (" ".join(flags) or "(values without a flag)")
        raise UsageError(f"{message} (see --help)")


# Read by the libraries behind a source rather than by Settings, listed in --help all the same.
_LIBRARY_ENV = (
    (
        "GOOGLE_APPLICATION_CREDENTIALS",
        "GCS service account key file (Application Default Credentials)",
    ),
    (
        "STORAGE_EMULATOR_HOST",
        "GCS emulator address (fake-gcs-server); anonymous unless a key is given",
    ),
    ("HTTPS_PROXY, HTTP_PROXY, NO_PROXY", "HTTP(S) proxy for every source"),
)


def _environment_only_help() -> str:
    """The settings that have no flag (credentials, endpoints), wrapped for a terminal."""
    rows = [(", ".join(o.env), o.help) for o in OPTIONS if o.flag is None] + list(_LIBRARY_ENV)
    lines = ["environment only:"]
    for names, text in rows:
        lines.append(f"  {names}")
        lines.extend(textwrap.wrap(text, 78, initial_indent="      ", subsequent_indent="      "))
    return "\n".join(lines)


def build_parser(defaults: AssetDefaults) -> argparse.ArgumentParser:
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
        epilog=_environment_only_help()
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
    asset_defaults = {
        "output": str(defaults.output),
        "allow_patterns": ",".join(defaults.allow_patterns) or "everything",
        "ignore_patterns": ",".join(defaults.ignore_patterns) or "nothing",
    }
    for option in OPTIONS:
        if option.flag is None:
            continue
        env_note = f" [env: {', '.join(option.env)}]"
        if option.dest in asset_defaults:
            env_note = f" (default: {asset_defaults[option.dest]})" + env_note
        if option.is_switch:
            parser.add_argument(
                option.flag,
                dest=option.dest,
                action="store_true",
                default=None,
                help=option.help + env_note,
            )
        else:
            parser.add_argument(
                option.flag,
                dest=option.dest,
                default=None,
                help=option.help + env_note,
            )
    return parser


def _read_secret_file(path: Path, what: str) -> str:
    try:
        value = path.read_text().strip()
    except OSError as exc:
        raise UsageError(f"cannot read the {what} file {path}: {exc.strerror}") from None
    if not value:
        raise UsageError(f"the {what} file {path} is empty")
    return value


def _resolve(option: Option, flags: argparse.Namespace, env: Mapping[str, str]) -> Any:
    """Flag value if given, else the first non-empty env var, parsed; None when unset."""
    raw: Any = getattr(flags, option.dest, None)
    source = option.flag
    if raw is True:  # a switch given on the command line
        return True
    if raw is None:
        for name in option.env:
            if env.get(name, "").strip():
                raw, source = env[name].strip(), name
                break
    if raw is None:
        return None
    try:
        return option.parse(raw)
    except ValueError as exc:
        secret = option.dest in (
            "secret_access_key",
            "token",
            "session_token",
            "http_headers",
            "gcs_key_json",
            "azure_key",
            "azure_sas",
            "azure_connection_string",
            "azure_client_secret",
        )
        shown = "…" if secret else raw
        raise UsageError(f"invalid {source}={shown!r}: {exc}") from None


def termination_log_for_bad_settings(argv: list[str] | None, env: Mapping[str, str]) -> Path:
    """Where to report a failure of :func:`load_settings` itself: the --termination-log flag or
    TERMINATION_LOG if given (read tolerantly, ignoring everything else), else the default."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    option = next(o for o in OPTIONS if o.dest == "termination_log")
    parser.add_argument(option.flag, dest=option.dest, default=None)  # type: ignore[arg-type]
    known, _ = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    try:
        return _resolve(option, known, env) or DEFAULT_TERMINATION_LOG
    except UsageError:
        return DEFAULT_TERMINATION_LOG


def load_settings(
    defaults: AssetDefaults, argv: list[str] | None, env: Mapping[str, str] | None = None
) -> Settings:
    """Parse flags and environment into :class:`Settings`, or raise UsageError."""
    env = os.environ if env is None else env
    flags = build_parser(defaults).parse_args(argv)
    values = {option.dest: _resolve(option, flags, env) for option in OPTIONS}

    uri = values["storage_uri"]
    if not uri:
        raise UsageError(
            "no source given: pass --storage-uri or set STORAGE_URI "
            "(e.g. hf://org/repo or s3://bucket/prefix)"
        )
    if len(uri) > MAX_URI_LENGTH:
        raise UsageError(f"the storage URI is {len(uri)} characters; at most {MAX_URI_LENGTH}")

    secret_file = values.pop("secret_access_key_file")
    if secret_file is not None:
        values["secret_access_key"] = _read_secret_file(secret_file, "secret access key")
    token_file = values.pop("token_file")
    if token_file is not None and not values["token"]:
        values["token"] = _read_secret_file(token_file, "token")
    if bool(values["access_key_id"]) != bool(values["secret_access_key"]):
        raise UsageError(
            "set both ACCESS_KEY_ID and SECRET_ACCESS_KEY (or neither, to use the "
            "AWS credential chain)"
        )
    if values["anonymous"] and (values["access_key_id"] or values["role_arn"]):
        raise UsageError("--anonymous cannot be combined with access keys or --role-arn")

    shards, shard_index = values["shards"] or 1, values["shard_index"]
    if values["shards"] and shard_index is None:
        raise UsageError(
            "--shards needs this pod's index: --shard-index or JOB_COMPLETION_INDEX "
            "(Kubernetes sets it in an Indexed Job)"
        )
    if shards > 1 and shard_index >= shards:
        raise UsageError(f"shard index {shard_index} is not below SHARDS={shards}")

    allow = values["allow_patterns"]
    ignore = values["ignore_patterns"]
    return Settings(
        kind=defaults.kind,
        storage_uri=uri,
        output=values["output"] or defaults.output,
        revision=values["revision"],
        allow_patterns=parse_patterns(allow, "allow") if allow else defaults.allow_patterns,
        ignore_patterns=parse_patterns(ignore, "ignore") if ignore else defaults.ignore_patterns,
        patterns_are_default=not allow
        and (not ignore or parse_patterns(ignore, "ignore") == defaults.ignore_patterns),
        fallback_weights=defaults.fallback_weights,
        workers=values["workers"] or 16,
        endpoint=values["endpoint"],
        hf_endpoint=values["hf_endpoint"],
        region=values["region"] or "auto",
        role_arn=values["role_arn"],
        anonymous=bool(values["anonymous"]),
        access_key_id=values["access_key_id"],
        secret_access_key=values["secret_access_key"],
        session_token=values["session_token"],
        token=values["token"],
        http_headers=values["http_headers"] or (),
        gcs_key_json=values["gcs_key_json"],
        **{name: values[name] for name in _AZURE_FIELDS},
        ca_bundle=values["ca_bundle"],
        cache_dir=values["cache_dir"],
        shards=shards,
        shard_index=(shard_index or 0) if shards > 1 else 0,
        shard_run=values["shard_run"] or "",
        log_format=values["log_format"] or "text",
        progress_interval=values["progress_interval"] or 5.0,
        timeout=values["timeout"] or 60.0,
        retries=values["retries"] or 8,
        termination_log=values["termination_log"] or DEFAULT_TERMINATION_LOG,
        debug=bool(values["debug"]),
    )

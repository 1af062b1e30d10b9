"""A table of bad inputs, each run through the real CLI: the documented exit code, one clear line.

The same table is shown in docs/reliability.md; a test keeps the two identical.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import ACCESS_KEY, SECRET_KEY, Bucket
from tests.reliability.conftest import FIGURES
from tests.servers.locked_s3 import locked_s3 as start_locked_s3

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "reliability.md"
KNOWN_TOKEN = "hf_known_token_0b3e"
S3 = {"ENDPOINT": "{s3}", "ACCESS_KEY_ID": ACCESS_KEY, "SECRET_ACCESS_KEY": SECRET_KEY}
HUB = {"HF_ENDPOINT": "{hub}"}
OK_S3 = {"STORAGE_URI": "s3://{bucket}/d", **S3}


@dataclass(frozen=True)
class Bad:
    """One bad input: what it is (for the docs), how it is given, and what must come out."""

    what: str
    env: dict[str, str]
    code: int
    message: str  # the one-line error contains this
    args: tuple[str, ...] = ()
    kind: str = "dataset"
    extra: dict[str, str] = field(default_factory=dict)


BAD_INPUTS: list[Bad] = [
    # -- storage URIs ------------------------------------------------------------------------
    Bad("`STORAGE_URI` not set", S3, 2, "no source given: pass --storage-uri or set STORAGE_URI"),
    Bad("`STORAGE_URI` blank (`'   '`)", {"STORAGE_URI": "   ", **S3}, 2, "no source given"),
    Bad("`--storage-uri ''`", S3, 2, "no source given", args=("--storage-uri", "")),
    Bad(
        "no scheme: `my-bucket/data`",
        {"STORAGE_URI": "my-bucket/data"},
        2,
        "is not of the form scheme://location",
    ),
    Bad(
        "unknown scheme: `ftp://host/data`",
        {"STORAGE_URI": "ftp://host/data"},
        2,
        "unsupported scheme ftp://",
    ),
    Bad(
        "`file://relative/path` (not absolute)",
        {"STORAGE_URI": "file://relative/path"},
        2,
        "the path must be absolute",
    ),
    Bad(
        "`https://host/models/` (no file name)",
        {"STORAGE_URI": "https://example.invalid/models/"},
        2,
        "does not end with a file name",
    ),
    Bad(
        "`https://host/m.tar.gz#sha256=abc` (a pin that is not a digest)",
        {"STORAGE_URI": "https://example.invalid/m.tar.gz#sha256=abc"},
        2,
        "the fragment is not a digest of the file; pin its content with #sha256=",
    ),
    Bad(
        "`gs://Bad_Bucket/d`",
        {"STORAGE_URI": "gs://Bad_Bucket/d"},
        2,
        "is not a valid bucket name",
    ),
    Bad(
        "`GOOGLE_APPLICATION_CREDENTIALS_JSON` that is not JSON",
        {"STORAGE_URI": "gs://bucket/d", "GOOGLE_APPLICATION_CREDENTIALS_JSON": "not json"},
        2,
        "GOOGLE_APPLICATION_CREDENTIALS_JSON is not valid JSON",
    ),
    Bad(
        "`az://container/d` without an account",
        {"STORAGE_URI": "az://container/d"},
        2,
        "az:// needs the storage account: set AZURE_STORAGE_ACCOUNT_NAME",
    ),
    Bad(
        "`AZURE_STORAGE_CONNECTION_STRING` that is not `Key=Value;...`",
        {"STORAGE_URI": "az://container/d", "AZURE_STORAGE_CONNECTION_STRING": "garbage"},
        2,
        "is not of the form Key=Value;Key=Value",
    ),
    Bad(
        "`HTTP_HEADERS` that is not a JSON object",
        {"STORAGE_URI": "https://example.invalid/m.bin", "HTTP_HEADERS": "Authorization: x"},
        2,
        "invalid HTTP_HEADERS='…': expected a JSON object",
    ),
    Bad(
        "`cache://dataset`",
        {"STORAGE_URI": "cache://ds"},
        2,
        "cache:// is not supported by these images",
    ),
    Bad(
        "scheme only: `s3://`", {"STORAGE_URI": "s3://"}, 2, "is not of the form scheme://location"
    ),
    Bad(
        "bucket only: `s3://BUCKET`",
        {"STORAGE_URI": "s3://{bucket}", **S3},
        2,
        "names a whole bucket; add a prefix",
    ),
    Bad(
        "`s3://Bad_Bucket/data`",
        {"STORAGE_URI": "s3://Bad_Bucket/d"},
        2,
        "is not a valid bucket name",
    ),
    Bad(
        "`s3://ab/data` (bucket name too short)",
        {"STORAGE_URI": "s3://ab/d"},
        2,
        "is not a valid bucket name",
    ),
    Bad(
        "`s3://my..bucket/data`",
        {"STORAGE_URI": "s3://my..bucket/d"},
        2,
        "is not a valid bucket name",
    ),
    Bad(
        "`s3://BUCKET//data` (key with a leading `/`)",
        {"STORAGE_URI": "s3://{bucket}//d", **S3},
        2,
        "the key starts with '/'",
    ),
    Bad("URI of 3000 characters", {"STORAGE_URI": "s3://b/" + "k" * 2993}, 2, "at most 2048"),
    Bad("`hf://`", {"STORAGE_URI": "hf://"}, 2, "is not of the form scheme://location"),
    Bad(
        "`hf://org` (no repo name)",
        {"STORAGE_URI": "hf://org"},
        2,
        "must be 'namespace/name'",
        kind="model",
    ),
    Bad(
        "`hf://org/re po`",
        {"STORAGE_URI": "hf://org/re po"},
        2,
        "Repo id must use alphanumeric chars",
        kind="model",
    ),
    Bad(
        "`hf://-org/repo`",
        {"STORAGE_URI": "hf://-org/repo"},
        2,
        "cannot start or end with '-'",
        kind="model",
    ),
    Bad(
        "`hf://org/repo--x`",
        {"STORAGE_URI": "hf://org/repo--x"},
        2,
        "Cannot have -- or .. in repo_id",
        kind="model",
    ),
    Bad(
        "`hf://org/` + 100 characters",
        {"STORAGE_URI": "hf://org/" + "r" * 100},
        2,
        "maximum length is 96",
        kind="model",
    ),
    Bad(
        "`hf://org/repo@` (empty revision)",
        {"STORAGE_URI": "hf://org/repo@"},
        2,
        "Empty revision after '@'",
        kind="model",
    ),
    Bad("`hf://datasets/`", {"STORAGE_URI": "hf://datasets/"}, 2, "Missing repository id"),
    Bad(
        "`hf://buckets/org/b`",
        {"STORAGE_URI": "hf://buckets/org/b"},
        2,
        "bucket URIs are not supported",
    ),
    # -- flags and environment ---------------------------------------------------------------
    Bad(
        "`ACCESS_KEY_ID` without `SECRET_ACCESS_KEY`",
        {"STORAGE_URI": "s3://{bucket}/d", "ACCESS_KEY_ID": ACCESS_KEY},
        2,
        "set both ACCESS_KEY_ID and SECRET_ACCESS_KEY",
    ),
    Bad(
        "`SECRET_ACCESS_KEY` without `ACCESS_KEY_ID`",
        {"STORAGE_URI": "s3://{bucket}/d", "SECRET_ACCESS_KEY": SECRET_KEY},
        2,
        "set both ACCESS_KEY_ID and SECRET_ACCESS_KEY",
    ),
    Bad(
        "`ANONYMOUS=true` with access keys",
        {**OK_S3, "ANONYMOUS": "true"},
        2,
        "--anonymous cannot be combined with access keys or --role-arn",
    ),
    Bad(
        "`--anonymous --role-arn ...`",
        {"STORAGE_URI": "s3://{bucket}/d"},
        2,
        "--anonymous cannot be combined",
        args=("--anonymous", "--role-arn", "arn:aws:iam::123456789012:role/r"),
    ),
    Bad("`ANONYMOUS=maybe`", {**OK_S3, "ANONYMOUS": "maybe"}, 2, "invalid ANONYMOUS='maybe'"),
    Bad("`WORKERS=0`", {**OK_S3, "WORKERS": "0"}, 2, "invalid WORKERS='0': must be at least 1"),
    Bad("`--workers many`", OK_S3, 2, "invalid --workers='many'", args=("--workers", "many")),
    Bad(
        "`TIMEOUT=-1`",
        {**OK_S3, "TIMEOUT": "-1"},
        2,
        "invalid TIMEOUT='-1': must be greater than 0",
    ),
    Bad(
        "`PROGRESS_INTERVAL=0`",
        {**OK_S3, "PROGRESS_INTERVAL": "0"},
        2,
        "invalid PROGRESS_INTERVAL='0'",
    ),
    Bad("`RETRIES=0`", {**OK_S3, "RETRIES": "0"}, 2, "invalid RETRIES='0'"),
    Bad("`LOG_FORMAT=xml`", {**OK_S3, "LOG_FORMAT": "xml"}, 2, "must be 'text' or 'json'"),
    Bad("`DEBUG=perhaps`", {**OK_S3, "DEBUG": "perhaps"}, 2, "invalid DEBUG='perhaps'"),
    Bad("unknown flag `--bogus`", OK_S3, 2, "unrecognized arguments: --bogus", args=("--bogus",)),
    Bad(
        "a secret as a flag: `--secret-access-key VALUE`",
        OK_S3,
        2,
        "unrecognized arguments: --secret-access-key (see --help)",  # the value is not echoed
        args=("--secret-access-key", "s3cr3t"),
    ),
    Bad(
        "`--secret-access-key-file` that does not exist",
        {"STORAGE_URI": "s3://{bucket}/d", "ACCESS_KEY_ID": ACCESS_KEY},
        2,
        "cannot read the secret access key file",
        args=("--secret-access-key-file", "{tmp}/no-such-file"),
    ),
    Bad(
        "`--token-file` that is empty",
        {"STORAGE_URI": "hf://org/model", **HUB},
        2,
        "is empty",
        args=("--token-file", "{tmp}/empty-token"),
        kind="model",
    ),
    Bad(
        "`ENDPOINT=not a url`",
        {**OK_S3, "ENDPOINT": "not a url"},
        2,
        "invalid S3 endpoint 'not a url'",
    ),
    Bad(
        "`ENDPOINT=ftp://host`",
        {**OK_S3, "ENDPOINT": "ftp://host"},
        2,
        "invalid S3 endpoint 'ftp://host': expected http(s)://host[:port]",
    ),
    Bad(
        "`HF_ENDPOINT=not a url`",
        {"STORAGE_URI": "hf://org/model", "HF_ENDPOINT": "not a url"},
        2,
        "is not an http(s):// URL",
        kind="model",
    ),
    Bad(
        "`https://` endpoint of a plain-HTTP server",
        {**OK_S3, "ENDPOINT": "{s3_https}"},
        2,
        "TLS verification failed",
    ),
    Bad(
        "`https://` Hub endpoint of a plain-HTTP server",
        {"STORAGE_URI": "hf://org/model", "HF_ENDPOINT": "{hub_https}"},
        2,
        "TLS verification failed",
        kind="model",
    ),
    Bad(
        "`REQUESTS_CA_BUNDLE` a file with no certificate in it",
        {"STORAGE_URI": "hf://org/model", **HUB, "REQUESTS_CA_BUNDLE": "{tmp}/a-file"},
        2,
        "holds no certificate OpenSSL can load",
        kind="model",
    ),
    # -- patterns ------------------------------------------------------------------------------
    Bad(
        "`ALLOW_PATTERNS=*.json,[abc`",
        {**OK_S3, "ALLOW_PATTERNS": "*.json,[abc"},
        2,
        "has an unclosed '['",
    ),
    Bad("`ALLOW_PATTERNS=,`", {**OK_S3, "ALLOW_PATTERNS": ","}, 2, "hold no pattern"),
    Bad("`IGNORE_PATTERNS=/abs/*`", {**OK_S3, "IGNORE_PATTERNS": "/abs/*"}, 2, "starts with '/'"),
    Bad(
        "`ALLOW_PATTERNS=*.parquet` matching nothing",
        {**OK_S3, "ALLOW_PATTERNS": "*.parquet"},
        4,
        "match the allow/ignore patterns",
    ),
    # -- credentials ---------------------------------------------------------------------------
    Bad(
        "no S3 credentials at all",
        {"STORAGE_URI": "s3://{bucket}/d", "ENDPOINT": "{s3}"},
        3,
        "no S3 credentials found",
    ),
    Bad(
        "wrong S3 secret key",
        {
            "STORAGE_URI": "s3://locked-bucket/d",
            "ENDPOINT": "{locked}",
            "ACCESS_KEY_ID": "{locked_key}",
            "SECRET_ACCESS_KEY": "wrong-secret",
        },
        3,
        "access denied (SignatureDoesNotMatch)",
    ),
    Bad(
        "unknown S3 access key id",
        {
            "STORAGE_URI": "s3://locked-bucket/d",
            "ENDPOINT": "{locked}",
            "ACCESS_KEY_ID": "AKIAUNKNOWN000000000",
            "SECRET_ACCESS_KEY": "whatever",
        },
        3,
        "access denied (InvalidAccessKeyId)",
    ),
    Bad(
        "`ROLE_ARN` with no credentials to assume it",
        {"STORAGE_URI": "s3://{bucket}/d", "ENDPOINT": "{s3}", "ROLE_ARN": "arn:aws:iam::1:role/r"},
        3,
        "ROLE_ARN is set but there are no credentials",
    ),
    Bad(
        "a Hub token the Hub does not know",
        {"STORAGE_URI": "hf://org/model", **HUB, "HF_TOKEN": "hf_unknown_token"},
        3,
        "access denied (HTTP 401)",
        kind="model",
    ),
    Bad(
        "private Hub repo without a token",
        {"STORAGE_URI": "hf://org/private", **HUB},
        4,
        "if it is private, pass a token",
        kind="model",
    ),
    Bad(
        "gated Hub repo whose conditions were not accepted",
        {"STORAGE_URI": "hf://org/gated", **HUB, "ACCESS_TOKEN": KNOWN_TOKEN},
        3,
        "is gated: accept its conditions",
        kind="model",
    ),
    Bad(
        "`gs://` with no credentials anywhere",
        {"STORAGE_URI": "gs://bucket/d", "NO_GCE_CHECK": "true"},
        3,
        "no GCS credentials found",
    ),
    # -- unreachable ---------------------------------------------------------------------------
    Bad(
        "S3 endpoint nobody listens on",
        {**OK_S3, "ENDPOINT": "http://127.0.0.1:9", "RETRIES": "2"},
        7,
        "still failing after 2 attempts",
    ),
    Bad(
        "Hub endpoint nobody listens on",
        {"STORAGE_URI": "hf://org/model", "HF_ENDPOINT": "http://127.0.0.1:9", "RETRIES": "2"},
        7,
        "still failing after 2 attempts",
        kind="model",
    ),
    Bad(
        "GCS endpoint nobody listens on",
        {"STORAGE_URI": "gs://bucket/d", "STORAGE_EMULATOR_HOST": "127.0.0.1:9", "RETRIES": "2"},
        7,
        "still failing after 2 attempts",
    ),
    Bad(
        "Azure endpoint nobody listens on",
        {
            "STORAGE_URI": "az://container/d",
            "AZURE_STORAGE_CONNECTION_STRING": "AccountName=acct;BlobEndpoint=http://127.0.0.1:9/acct",
            "RETRIES": "2",
        },
        7,
        "still failing after 2 attempts",
    ),
    Bad(
        "http(s) server nobody listens on",
        {"STORAGE_URI": "http://127.0.0.1:9/model.bin", "RETRIES": "2"},
        7,
        "still failing after 2 attempts",
        kind="model",
    ),
    # -- not found -----------------------------------------------------------------------------
    Bad(
        "`file://` path that does not exist",
        {"STORAGE_URI": "file:///nonexistent/models/llama"},
        4,
        "does not exist; check the path and that the volume is mounted",
    ),
    Bad(
        "http(s) URL the server does not have",
        {"STORAGE_URI": "{hub}/no/such/model.bin"},
        4,
        "not found (HTTP 404)",
        kind="model",
    ),
    Bad(
        "bucket that does not exist",
        {**OK_S3, "STORAGE_URI": "s3://no-such-bucket-0000/d"},
        4,
        "bucket 'no-such-bucket-0000' does not exist",
    ),
    Bad(
        "prefix with no objects",
        {**OK_S3, "STORAGE_URI": "s3://{bucket}/nothing"},
        4,
        "no objects under",
    ),
    Bad(
        "Hub repo that does not exist",
        {"STORAGE_URI": "hf://org/no-such-repo", **HUB},
        4,
        "repository not found",
        kind="model",
    ),
    Bad(
        "revision that does not exist",
        {"STORAGE_URI": "hf://org/model@no-such-branch", **HUB},
        4,
        "revision 'no-such-branch' does not exist",
        kind="model",
    ),
    Bad(
        "path that does not exist in the repo",
        {"STORAGE_URI": "hf://org/model/no/such.json", **HUB},
        4,
        "no file or folder 'no/such.json'",
        kind="model",
    ),
    # -- local storage -------------------------------------------------------------------------
    Bad(
        "`OUTPUT_PATH` under a regular file",
        OK_S3,
        6,
        "cannot write",
        extra={"OUTPUT_PATH": "{tmp}/a-file/dataset"},
    ),
    Bad(
        "`OUTPUT_PATH` is a regular file",
        OK_S3,
        6,
        "cannot write",
        extra={"OUTPUT_PATH": "{tmp}/a-file"},
    ),
    Bad(
        "`CACHE_DIR` is a regular file",
        OK_S3,
        6,
        "cannot write",
        extra={"CACHE_DIR": "{tmp}/a-file"},
    ),
    Bad(
        "`CACHE_DIR` set, `OUTPUT_PATH` a folder with files in it",
        OK_S3,
        6,
        "is a folder with files in it; with CACHE_DIR the output becomes a link",
        extra={"CACHE_DIR": "{tmp}/cache", "OUTPUT_PATH": "{tmp}/full-folder"},
    ),
]


def markdown_table() -> str:
    """The table as the README shows it."""
    lines = ["| # | bad input | exit | message contains |", "|---|---|---|---|"]
    for number, bad in enumerate(BAD_INPUTS, 1):
        shown = bad.message.replace("|", "\\|")
        lines.append(f"| {number} | {bad.what} | {bad.code} | `{shown}` |")
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def locked_s3() -> Iterator[tuple[str, str]]:
    """A separate moto server with authentication on (tests/servers/locked_s3.py): (endpoint,
    a valid access key id)."""
    with start_locked_s3() as s3:
        client = s3.client()
        client.create_bucket(Bucket="locked-bucket")  # type: ignore[attr-defined]
        client.put_object(Bucket="locked-bucket", Key="d/a.txt", Body=b"a")  # type: ignore[attr-defined]
        yield s3.endpoint, s3.access_key


def run_bad(bad: Bad, number: int, values: dict[str, str], home: Path) -> str | None:
    """Run one row; return what is wrong with the outcome, or None when it is as documented."""
    out = Path(values["tmp"]) / f"out-{number}"
    log = Path(values["tmp"]) / f"termination-{number}"
    env = {
        "PATH": sys.executable.rsplit("/", 1)[0] + ":/usr/bin:/bin",
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "AWS_CONFIG_FILE": str(home / "none"),
        "AWS_SHARED_CREDENTIALS_FILE": str(home / "none"),
        "AWS_EC2_METADATA_DISABLED": "true",
        "OUTPUT_PATH": str(out),
        "TERMINATION_LOG": str(log),
    }
    env.update({k: v.format(**values) for k, v in {**bad.env, **bad.extra}.items()})
    args = [a.format(**values) for a in bad.args]
    proc = subprocess.run(
        [sys.executable, "-m", f"initializers.{bad.kind}", *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    errors = [line for line in proc.stderr.splitlines() if ": error: " in line]
    problems = []
    if proc.returncode != bad.code:
        problems.append(f"exit {proc.returncode}, expected {bad.code}")
    if len(errors) != 1 or bad.message not in errors[0]:
        problems.append(f"error line(s) {errors!r} lack {bad.message!r}")
    if "Traceback" in proc.stderr + proc.stdout:
        problems.append("a traceback was printed")
    if errors and (not log.exists() or log.read_text().strip() not in errors[0]):
        problems.append("the termination log does not hold the error line")
    if problems:
        return f"#{number} {bad.what}: {'; '.join(problems)}\n{proc.stderr[-600:]}"
    return None


def test_the_table_holds_at_least_forty_bad_inputs():
    assert len(BAD_INPUTS) >= 40
    assert len({bad.what for bad in BAD_INPUTS}) == len(BAD_INPUTS)


def test_every_bad_input_exits_with_its_documented_code_and_one_clear_line(
    bucket: Bucket, hub, locked_s3, tmp_path
):
    bucket.put("d/a.txt", b"a")
    hub.tokens.add(KNOWN_TOKEN)
    hub.add_repo("org/model", {"config.json": b"{}"})
    hub.add_repo("org/private", {"config.json": b"{}"}, private=True)
    hub.add_repo("org/gated", {"config.json": b"{}"}, gated=True, access=[])
    (tmp_path / "a-file").write_text("a file, not a folder")
    (tmp_path / "empty-token").write_text("")
    (tmp_path / "full-folder").mkdir()
    (tmp_path / "full-folder" / "mine.txt").write_text("the user's, never touched")
    home = tmp_path / "home"
    home.mkdir()
    values = {
        "bucket": bucket.name,
        "s3": bucket.endpoint,
        "s3_https": bucket.endpoint.replace("http://", "https://"),
        "hub": hub.endpoint,
        "hub_https": hub.endpoint.replace("http://", "https://"),
        "locked": locked_s3[0],
        "locked_key": locked_s3[1],
        "tmp": str(tmp_path),
    }
    with ThreadPoolExecutor(4) as pool:
        outcomes = list(
            pool.map(
                lambda pair: run_bad(pair[1], pair[0], values, home),
                enumerate(BAD_INPUTS, 1),
            )
        )
    failures = [outcome for outcome in outcomes if outcome]
    assert failures == [], "\n\n".join(failures)
    assert (tmp_path / "full-folder" / "mine.txt").read_text() == "the user's, never touched"
    FIGURES["bad inputs tried"] += len(BAD_INPUTS)


def test_the_bad_input_table_in_the_readme_is_the_one_the_tests_run():
    assert markdown_table() in DOC.read_text(), (
        "docs/reliability.md is out of date: paste"
        " tests.reliability.test_bad_inputs.markdown_table() into it"
    )

"""Credentials never leak: not in output, logs, the termination message, files, or any argv.

Each run uses recognisable secrets (an S3 secret key and session token, a Hub token) and is made
to succeed, retry and fail in the ways that print the most; everything it leaves behind is then
searched for the secrets and for their distinctive fragments. A poller reads the command line
of every process on the machine while the runs go.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import SECRET_KEY
from tests.reliability.conftest import dataset, fill, s3_env
from tests.servers.faultproxy import every_fault

MIB = 1 << 20
SESSION_TOKEN = "FQoGZXIvYXdzEJr-session-token-do-not-leak-42aa"
HUB_TOKEN = "hf_hub_token_do_not_leak_5e1d9b"
SECRETS = (SECRET_KEY, SESSION_TOKEN, HUB_TOKEN, "do-not-leak", "do_not_leak")


class ArgvWatch:
    """Reads /proc/*/cmdline of every process, over and over, until stopped."""

    def __init__(self) -> None:
        self.hits: list[str] = []
        self.scans = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
                with contextlib.suppress(OSError):
                    argv = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
                    if any(secret in argv for secret in SECRETS):
                        self.hits.append(argv)
            self.scans += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


@pytest.fixture
def argv_watch() -> Iterator[ArgvWatch]:
    watch = ArgvWatch()
    watch._thread.start()
    yield watch
    watch.stop()


def leaks(*texts: str, folders: tuple[Path, ...] = ()) -> list[str]:
    """Every place a secret (or a fragment of one) shows up."""
    found = [f"output #{i}: {s!r}" for i, text in enumerate(texts) for s in SECRETS if s in text]
    for folder in folders:
        for path in folder.rglob("*"):
            if path.is_file():
                body = path.read_bytes()
                found += [f"{path}: {s!r}" for s in SECRETS if s.encode() in body]
    return found


def test_s3_runs_that_succeed_retry_and_fail_leak_no_secret_anywhere(
    stable_bucket, s3_endpoint, proxies, run_initializer, tmp_path, argv_watch
):
    bucket = stable_bucket
    fill(bucket, "d", dataset(51, {"a.bin": 12 * MIB, "b.json": 2_000}))
    proxy = proxies(s3_endpoint, seed=9, share=0.3, faults=every_fault(stall_seconds=30))
    log = tmp_path / "termination-log"
    common = {
        "SESSION_TOKEN": SESSION_TOKEN,
        "LOG_FORMAT": "json",
        "DEBUG": "true",
        "TIMEOUT": "1",
        "TERMINATION_LOG": str(log),
    }
    outputs, folders = [], []
    for prefix, expected in (("d", 0), ("missing", 4)):
        out = tmp_path / f"out-{prefix}"
        result = run_initializer("dataset", env=s3_env(bucket, proxy.url, prefix, out, **common))
        assert result.code == expected, result.output
        outputs += [result.stdout, result.stderr]
        folders.append(out)
    assert proxy.total_injected > 0  # the success path went through retries
    json_lines = [json.loads(line) for line in outputs[1].splitlines()]
    assert json_lines and all("message" in line for line in json_lines)

    # A source that never recovers, with the secret key given as a file.
    key_file = tmp_path / "secret-key"
    key_file.write_text(SECRET_KEY)
    dead = proxies(s3_endpoint, share=1.0, faults=every_fault()[1:4], max_in_a_row=10**9)
    env = s3_env(bucket, dead.url, "d", tmp_path / "out-dead", RETRIES="2", **common)
    del env["SECRET_ACCESS_KEY"]
    failed = run_initializer("dataset", "--secret-access-key-file", str(key_file), env=env)
    assert failed.code == 7, failed.output
    outputs += [failed.stdout, failed.stderr, log.read_text()]
    argv_watch.stop()
    assert argv_watch.scans > 0
    assert argv_watch.hits == []

    # A secret wrongly given as a flag (so in argv, by the user's hand) is not echoed.
    for flag in (["--secret-access-key", SECRET_KEY], [f"--secret-access-key={SECRET_KEY}"]):
        refused = run_initializer("dataset", *flag, env=env)
        assert refused.code == 2, refused.output
        assert "unrecognized arguments: --secret-access-key" in refused.stderr
        outputs += [refused.stdout, refused.stderr, log.read_text()]
    assert leaks(*outputs, folders=tuple(folders)) == []


def test_hub_runs_that_succeed_retry_and_fail_leak_no_token_anywhere(
    hub, proxies, run_initializer, tmp_path, argv_watch
):
    hub.tokens.add(HUB_TOKEN)
    model = {"model.safetensors": b"w" * (3 * MIB), "config.json": b"{}"}
    hub.add_repo("org/private", model, private=True)
    hub.add_repo("org/gated", {"model.safetensors": b"g"}, gated=True, access=[])
    cdn = proxies(hub.cdn_endpoint, seed=4, share=0.5, faults=every_fault(stall_seconds=30)[:5])
    api = proxies(hub.endpoint, rewrite_location={hub.cdn_endpoint: cdn.url})
    log = tmp_path / "termination-log"
    token_file = tmp_path / "token"
    token_file.write_text(HUB_TOKEN)
    runs = [
        ("hf://org/private", {"HF_TOKEN": HUB_TOKEN}, (), 0),
        ("hf://org/gated", {"ACCESS_TOKEN": HUB_TOKEN}, (), 3),
        ("hf://org/private", {}, ("--token-file", str(token_file)), 0),
        ("hf://org/missing", {"ACCESS_TOKEN": HUB_TOKEN}, (), 4),
    ]
    outputs, folders = [], []
    for i, (uri, secret_env, args, expected) in enumerate(runs):
        out = tmp_path / f"out-{i}"
        env = {
            "STORAGE_URI": uri,
            "HF_ENDPOINT": api.url,
            "OUTPUT_PATH": str(out),
            "LOG_FORMAT": "json",
            "DEBUG": "true",
            "TIMEOUT": "1",
            "TERMINATION_LOG": str(log),
            **secret_env,
        }
        result = run_initializer("model", *args, env=env)
        assert result.code == expected, (uri, result.output)
        outputs += [result.stdout, result.stderr]
        if expected:
            outputs.append(log.read_text())
        folders.append(out)
    # A token the Hub does not know: refused everywhere.
    hub.tokens.discard(HUB_TOKEN)
    env = {"STORAGE_URI": "hf://org/private", "HF_ENDPOINT": api.url, "HF_TOKEN": HUB_TOKEN}
    refused = run_initializer(
        "model", env={**env, "OUTPUT_PATH": str(tmp_path / "x"), "TERMINATION_LOG": str(log)}
    )
    assert refused.code in (3, 4), refused.output
    outputs += [refused.stdout, refused.stderr, log.read_text()]

    assert cdn.total_injected > 0
    argv_watch.stop()
    assert argv_watch.hits == []
    assert leaks(*outputs, folders=tuple(folders)) == []
    assert hub.leaked_auth == []  # the token never went to the CDN, even through the proxies


def test_a_presigned_urls_signature_is_never_written_to_the_manifest_or_the_cache(
    web, run_initializer, tmp_path
):
    body = dataset(71, {"w": 3 * MIB})["w"]
    url = web.put("/dl/model.safetensors", body) + "?X-Amz-Signature=sig-do-not-leak-77"
    plain = tmp_path / "plain"
    cache = tmp_path / "cache"
    outputs = []
    for env in (
        {"OUTPUT_PATH": str(plain)},
        {"OUTPUT_PATH": str(tmp_path / "ws"), "CACHE_DIR": str(cache)},
    ):
        result = run_initializer("model", env={"STORAGE_URI": url, "DEBUG": "true", **env})
        assert result.code == 0, result.output
        outputs += [result.stdout, result.stderr]

    assert (plain / "model.safetensors").read_bytes() == body
    assert leaks(*outputs, folders=(plain, cache)) == []

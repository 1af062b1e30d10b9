"""The initializers against a local server speaking the Hub's HTTP API, through the real CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import clean_env, tree
from tests.servers.hub import Fault, HubServer, fail_times

TOKEN = "hf_testtoken_do_not_leak_93f2a1"
MODEL = {
    "config.json": b'{"model_type": "llama"}',
    "generation_config.json": b"{}",
    "model.safetensors": os.urandom(256 << 10),
    "tokenizer.json": b'{"version": "1.0"}',
    "tokenizer_config.json": b"{}",
    "pytorch_model.bin": b"legacy weights",
    "flax_model.msgpack": b"flax weights",
    "README.md": b"# a model card",
}


def hf_env(hub: HubServer, uri: str, out: Path, **extra: str) -> dict[str, str]:
    return {"STORAGE_URI": uri, "HF_ENDPOINT": hub.endpoint, "OUTPUT_PATH": str(out), **extra}


def manifest(dest: Path) -> dict:
    return json.loads((dest / ".initializer-manifest.json").read_text())


def peak_rss_kib(kind: str, env: dict[str, str]) -> int:
    """Run the ``kind`` initializer to success and return its peak RSS in KiB.

    A fresh parent runs it, so ru_maxrss of its children is this one initializer's peak."""
    probe = (
        "import resource, subprocess, sys;"
        f"code = subprocess.call([sys.executable, '-m', 'initializers.{kind}']);"
        "print(code, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300
    )
    code, peak_kib = result.stdout.split()
    assert code == "0", result.stderr
    return int(peak_kib)


def test_model_repo_lands_safetensors_configs_and_tokenizer(hub, run_initializer, tmp_path):
    sha = hub.add_repo("org/llama", MODEL)
    result = run_initializer("model", env=hf_env(hub, "hf://org/llama", tmp_path))
    assert result.code == 0, result.output
    assert tree(tmp_path) == {
        name: MODEL[name]
        for name in (
            "config.json",
            "generation_config.json",
            "model.safetensors",
            "tokenizer.json",
            "tokenizer_config.json",
        )
    }
    recorded = manifest(tmp_path)
    assert recorded["revision"] == sha
    assert recorded["files"]["model.safetensors"]["checksum"].startswith("sha256:")
    assert recorded["files"]["config.json"]["checksum"].startswith("git-sha1:")


def test_large_files_follow_the_redirect_without_sending_the_token_to_the_cdn(
    hub, run_initializer, tmp_path
):
    hub.tokens.add(TOKEN)
    hub.add_repo("org/private", {"model.safetensors": os.urandom(3 << 20)}, private=True)
    result = run_initializer(
        "model", env=hf_env(hub, "hf://org/private", tmp_path, ACCESS_TOKEN=TOKEN)
    )
    assert result.code == 0, result.output
    assert hub.find_requests(server="cdn", method="GET")
    assert hub.leaked_auth == []


def test_dataset_repo_by_explicit_type(hub, run_initializer, tmp_path):
    files = {"train/part-0.jsonl": b'{"x": 1}\n', "test/part-0.jsonl": b'{"x": 2}\n'}
    hub.add_repo("org/alpaca", files, repo_type="dataset")
    result = run_initializer("dataset", env=hf_env(hub, "hf://datasets/org/alpaca", tmp_path))
    assert result.code == 0, result.output
    assert tree(tmp_path) == files


def test_a_sub_path_fetches_only_that_folder_at_its_place_in_the_repo(
    hub, run_initializer, tmp_path
):
    hub.add_repo(
        "org/multi",
        {
            "a/config.json": b"a",
            "a/deep/x.json": b"x",
            "b/config.json": b"b",
            "ab/config.json": b"ab",
        },
    )
    result = run_initializer("dataset", env=hf_env(hub, "hf://models/org/multi/a", tmp_path))
    assert result.code == 0, result.output
    assert tree(tmp_path) == {"a/config.json": b"a", "a/deep/x.json": b"x"}
    assert sorted(manifest(tmp_path)["files"]) == ["a/config.json", "a/deep/x.json"]


def test_a_sub_path_naming_one_file_fetches_that_file_at_its_place_in_the_repo(
    hub, run_initializer, tmp_path
):
    hub.add_repo(
        "org/ds", {"data/train.jsonl": b"t\n", "data/test.jsonl": b"e\n"}, repo_type="dataset"
    )
    uri = "hf://datasets/org/ds/data/train.jsonl"
    result = run_initializer("dataset", env=hf_env(hub, uri, tmp_path))
    assert result.code == 0, result.output
    # Where the Kubeflow SDK's TorchTune trainer looks: dataset.data_files=<output>/<sub-path>.
    assert tree(tmp_path) == {"data/train.jsonl": b"t\n"}


def test_revision_in_the_uri_pins_a_tag(hub, run_initializer, tmp_path):
    hub.add_repo("org/m", {"config.json": b"v1"})
    v1 = hub.tag("org/m", "v1")
    hub.commit("org/m", {"config.json": b"v2"})
    result = run_initializer("model", env=hf_env(hub, "hf://org/m@v1", tmp_path))
    assert result.code == 0, result.output
    assert tree(tmp_path) == {"config.json": b"v1"}
    assert manifest(tmp_path)["revision"] == v1


def test_revision_env_overrides_the_uri(hub, run_initializer, tmp_path):
    first = hub.add_repo("org/m", {"config.json": b"v1"})
    hub.commit("org/m", {"config.json": b"v2"})
    result = run_initializer("model", env=hf_env(hub, "hf://org/m@main", tmp_path, REVISION=first))
    assert result.code == 0, result.output
    assert tree(tmp_path) == {"config.json": b"v1"}


def test_a_new_commit_updates_only_the_changed_files(hub, run_initializer, tmp_path):
    hub.add_repo("org/m", {"config.json": b"v1", "model.safetensors": b"w" * 4096})
    env = hf_env(hub, "hf://org/m", tmp_path)
    assert run_initializer("model", env=env).code == 0
    weights_mtime = (tmp_path / "model.safetensors").stat().st_mtime_ns
    hub.commit("org/m", {"config.json": b"v2"})
    result = run_initializer("model", env=env)
    assert result.code == 0, result.output
    assert tree(tmp_path) == {"config.json": b"v2", "model.safetensors": b"w" * 4096}
    assert (tmp_path / "model.safetensors").stat().st_mtime_ns == weights_mtime
    assert "1 fetched" in result.stderr


def test_only_the_repo_is_asked_for_even_with_the_libraries_telemetry_left_on(
    hub, run_initializer, tmp_path
):
    """huggingface_hub fetches an "agent harness" registry from the endpoint before its first API
    call unless telemetry is off (once a day per HF_HOME, so on every pod start)."""
    hub.add_repo("org/llama", MODEL)
    env = hf_env(hub, "hf://org/llama", tmp_path / "out", HF_HUB_DISABLE_TELEMETRY="")
    result = run_initializer("model", env=env)
    assert result.code == 0, result.output
    asked = {r.path.split("?")[0] for r in hub.find_requests(server="hub")}
    assert asked and all("/org/llama" in path for path in asked), asked


def test_the_repo_info_asked_for_is_its_commit_and_gating_not_its_file_list(
    hub, run_initializer, tmp_path
):
    """The files come from the tree's pages as the fetch runs; a repo of 100,000 files would
    otherwise send all their names in its info before the first GET."""
    hub.add_repo("org/many", MODEL)
    assert run_initializer("model", env=hf_env(hub, "hf://org/many", tmp_path)).code == 0
    infos = [r.path for r in hub.find_requests(server="hub") if "/api/models/" in r.path
             and "/tree/" not in r.path]  # fmt: skip
    assert infos and all("expand=sha" in p and "expand=gated" in p for p in infos), infos
    assert not any("siblings" in p for p in infos)


def test_rerun_against_an_unchanged_repo_downloads_nothing(hub, run_initializer, tmp_path):
    hub.add_repo("org/m", MODEL)
    env = hf_env(hub, "hf://org/m", tmp_path)
    assert run_initializer("model", env=env).code == 0
    downloads = len(hub.find_requests(path_contains="/resolve/"))
    result = run_initializer("model", env=env)
    assert result.code == 0 and "nothing to fetch" in result.stderr
    assert len(hub.find_requests(path_contains="/resolve/")) == downloads


def test_private_repo_without_a_token_is_not_found_with_a_token_hint(
    hub, run_initializer, tmp_path
):
    hub.tokens.add(TOKEN)
    hub.add_repo("org/secret", {"config.json": b"{}"}, private=True)
    result = run_initializer("model", env=hf_env(hub, "hf://org/secret", tmp_path))
    assert result.code == 4
    assert "if it is private, pass a token (ACCESS_TOKEN or HF_TOKEN)" in result.stderr


def test_private_repo_token_from_each_accepted_place(hub, run_initializer, tmp_path):
    hub.tokens.add(TOKEN)
    hub.add_repo("org/secret", {"config.json": b"{}"}, private=True)
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    ways = {
        "ACCESS_TOKEN": {"ACCESS_TOKEN": TOKEN},
        "HF_TOKEN": {"HF_TOKEN": TOKEN},
        "--token-file": {"ACCESS_TOKEN_FILE": str(token_file)},
    }
    for name, extra in ways.items():
        out = tmp_path / name
        result = run_initializer("model", env=hf_env(hub, "hf://org/secret", out, **extra))
        assert result.code == 0, (name, result.output)
        assert TOKEN not in result.output


def test_gated_repo_without_access_says_where_to_accept_the_conditions(
    hub, run_initializer, tmp_path
):
    hub.tokens.add(TOKEN)
    hub.add_repo("org/gated", {"config.json": b"{}"}, gated="manual", access=[])
    result = run_initializer(
        "model", env=hf_env(hub, "hf://org/gated", tmp_path, ACCESS_TOKEN=TOKEN)
    )
    assert result.code == 3
    assert f"accept its conditions at {hub.endpoint}/org/gated" in result.stderr
    assert TOKEN not in result.output


def test_gated_repo_with_an_accepted_token_downloads(hub, run_initializer, tmp_path):
    hub.tokens.add(TOKEN)
    hub.add_repo("org/gated", {"config.json": b"{}"}, gated="auto", access=[TOKEN])
    result = run_initializer(
        "model", env=hf_env(hub, "hf://org/gated", tmp_path, ACCESS_TOKEN=TOKEN)
    )
    assert result.code == 0, result.output


def test_missing_repo_revision_and_path_exit_4(hub, run_initializer, tmp_path):
    hub.add_repo("org/m", {"config.json": b"{}"})
    cases = {
        "hf://org/nope": "repository not found",
        "hf://org/m@no-such-branch": "revision 'no-such-branch' does not exist",
        "hf://org/m/no/such/folder": "no file or folder 'no/such/folder'",
    }
    for uri, message in cases.items():
        result = run_initializer("model", env=hf_env(hub, uri, tmp_path / "out"))
        assert result.code == 4, (uri, result.output)
        assert message in result.stderr, uri


def test_transient_cdn_failures_are_retried_and_the_bytes_are_identical(
    hub, run_initializer, tmp_path
):
    weights = os.urandom(2 << 20)
    hub.add_repo("org/m", {"model.safetensors": weights, "config.json": b"{}"})
    hub.fault = fail_times(3, Fault.error(503), server="cdn")
    result = run_initializer("model", env=hf_env(hub, "hf://org/m", tmp_path))
    assert result.code == 0, result.output
    assert (tmp_path / "model.safetensors").read_bytes() == weights
    assert result.stderr.count("retrying in") >= 1


def test_a_body_cut_short_resumes_within_the_range(hub, run_initializer, tmp_path):
    weights = os.urandom(3 << 20)
    hub.add_repo("org/m", {"model.safetensors": weights})
    hub.fault = fail_times(1, Fault.truncate(after_bytes=1 << 20), server="cdn")
    result = run_initializer("model", env=hf_env(hub, "hf://org/m", tmp_path))
    assert result.code == 0, result.output
    assert (tmp_path / "model.safetensors").read_bytes() == weights
    resumed = [r for r in hub.find_requests(server="cdn", method="GET") if r.range]
    assert any(r.range.startswith(f"bytes={1 << 20}-") for r in resumed), resumed


def test_a_source_that_keeps_failing_exits_7(hub, run_initializer, tmp_path):
    hub.add_repo("org/m", {"model.safetensors": os.urandom(1 << 20)})
    hub.fault = fail_times(10_000, Fault.error(503), server="cdn")
    result = run_initializer("model", env=hf_env(hub, "hf://org/m", tmp_path, RETRIES="2"))
    assert result.code == 7, result.output
    assert "still failing after 2 attempts" in result.stderr
    assert not (tmp_path / "model.safetensors").exists()


def test_bytes_that_do_not_match_the_hub_sha256_exit_5_and_leave_no_file(
    hub, run_initializer, tmp_path
):
    blob = tmp_path / "served.safetensors"
    blob.write_bytes(os.urandom(1 << 20))
    hub.add_repo("org/m", {"model.safetensors": blob})
    blob.write_bytes(os.urandom(1 << 20))  # bit rot on the CDN: same size, other bytes
    out = tmp_path / "out"
    result = run_initializer("model", env=hf_env(hub, "hf://org/m", out))
    assert result.code == 5, result.output
    assert "checksum mismatch twice" in result.stderr
    assert not (out / "model.safetensors").exists()
    assert not (out / ".model.safetensors.part").exists()


def test_fetching_a_1_gib_file_keeps_peak_memory_under_200_mib(hub, tmp_path):
    big = tmp_path / "big.safetensors"
    block = os.urandom(1 << 20)
    with big.open("wb") as handle:
        for _ in range(1024):
            handle.write(block)
    hub.add_repo("org/big", {"model.safetensors": big})
    out = tmp_path / "out"
    peak_kib = peak_rss_kib("model", clean_env(tmp_path, **hf_env(hub, "hf://org/big", out)))
    assert peak_kib < 200 * 1024, f"peak RSS {peak_kib // 1024} MiB"
    assert (out / "model.safetensors").stat().st_size == 1 << 30


def test_the_dataset_initializer_reads_an_untyped_uri_as_a_dataset_repo_like_upstream(
    hub, run_initializer, tmp_path
):
    hub.add_repo("tatsu-lab/alpaca", {"data.jsonl": b"dataset\n"}, repo_type="dataset")
    hub.add_repo("tatsu-lab/alpaca", {"config.json": b"a model of the same name"})
    dataset = run_initializer("dataset", env=hf_env(hub, "hf://tatsu-lab/alpaca", tmp_path / "d"))
    assert dataset.code == 0, dataset.output
    assert tree(tmp_path / "d") == {"data.jsonl": b"dataset\n"}
    model = run_initializer("model", env=hf_env(hub, "hf://tatsu-lab/alpaca", tmp_path / "m"))
    assert model.code == 0, model.output
    assert tree(tmp_path / "m") == {"config.json": b"a model of the same name"}
    explicit = run_initializer(
        "dataset", env=hf_env(hub, "hf://models/tatsu-lab/alpaca", tmp_path / "x")
    )
    assert tree(tmp_path / "x") == {"config.json": b"a model of the same name"}, explicit.output


def test_many_small_files_requested_ahead_keep_peak_memory_under_200_mib(hub, tmp_path):
    # 500 MiB of bodies under 1 MiB each, all read ahead of the workers: none may be held
    # once written (a body kept alive by its read-ahead future once cost 1.2 GiB on 1 GiB).
    body = tmp_path / "shard.jsonl"
    body.write_bytes(os.urandom((1 << 20) - 7))
    hub.add_repo("org/d", {f"data/{i:03d}.jsonl": body for i in range(500)}, repo_type="dataset")
    out = tmp_path / "out"
    env = clean_env(tmp_path, **hf_env(hub, "hf://datasets/org/d", out))
    peak_kib = peak_rss_kib("dataset", env)
    assert peak_kib < 200 * 1024, f"peak RSS {peak_kib // 1024} MiB"
    assert len(list((out / "data").iterdir())) == 500


def test_the_hubs_api_answers_are_asked_for_gzipped_as_the_librarys_client_asks(
    hub, run_initializer, tmp_path
):
    # A tree page of 1,000 files is some 200 KB of JSON: the Hub compresses it when asked.
    files = {f"data/{i:04d}.txt": b"x" for i in range(30)}
    hub.add_repo("org/d", files, repo_type="dataset")
    result = run_initializer("dataset", env=hf_env(hub, "hf://datasets/org/d", tmp_path))
    assert result.code == 0, result.output
    assert {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.txt")} == set(files)
    api = [r for r in hub.requests if r.server == "hub" and "/api/" in r.path]
    assert api and all("gzip" in r.headers.get("accept-encoding", "") for r in api), api


def test_a_hub_fetch_loads_neither_hf_api_nor_the_librarys_shared_client(hub, tmp_path):
    """Loading ``huggingface_hub.hf_api`` cost ~130 ms of every run's start, building the
    library's shared client (httpcore, an httpx client, certifi's roots) ~45 ms more: the
    listing goes over the source's own pool with the library's status check (sources/hubapi.py)."""
    hub.add_repo("org/llama", MODEL)
    script = (
        "import os, sys\n"
        "from initializers.cli import run\n"
        "from initializers.model import DEFAULTS\n"
        "code = run(DEFAULTS, sys.argv[1:])\n"
        "loaded = [name in sys.modules for name in ('huggingface_hub.hf_api', 'httpcore2')]\n"
        "print(code, *loaded, flush=True)\n"
        "os._exit(0)  # as the entrypoint ends (cli.main_for)\n"
    )
    (home := tmp_path / "home").mkdir()
    env = clean_env(home, HF_ENDPOINT=hub.endpoint, TERMINATION_LOG=str(tmp_path / "t"))
    argv = ["--storage-uri", "hf://org/llama", "--output", str(tmp_path / "out")]
    found = subprocess.run(
        [sys.executable, "-c", script, *argv], env=env, capture_output=True, text=True
    )
    assert found.stdout.split() == ["0", "False", "False"], found.stderr
    assert "model.safetensors" in tree(tmp_path / "out")

"""Settings: flags beat env, Kubeflow and ecosystem names both work, defaults survive."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from initializers.config import load_settings
from initializers.dataset import DEFAULTS as DATASET
from initializers.errors import UsageError
from initializers.model import DEFAULTS as MODEL


def test_unset_ignore_patterns_keep_the_model_defaults():
    settings = load_settings(MODEL, [], {"STORAGE_URI": "hf://org/m"})
    assert settings.ignore_patterns == ("*.msgpack", "*.h5", "*.bin", "*.pt", "*.pth")
    assert "*.safetensors" in settings.allow_patterns
    assert settings.output == Path("/workspace/model")
    assert settings.patterns_are_default


def test_empty_env_values_count_as_unset():
    settings = load_settings(
        MODEL, [], {"STORAGE_URI": "hf://org/m", "IGNORE_PATTERNS": "", "OUTPUT_PATH": " "}
    )
    assert settings.ignore_patterns == MODEL.ignore_patterns
    assert settings.output == Path("/workspace/model")


def test_the_sdk_default_ignore_list_still_counts_as_default_patterns():
    env = {"STORAGE_URI": "hf://org/m", "IGNORE_PATTERNS": "*.msgpack,*.h5,*.bin,*.pt,*.pth"}
    assert load_settings(MODEL, [], env).patterns_are_default


def test_user_patterns_are_not_default():
    env = {"STORAGE_URI": "hf://org/m", "ALLOW_PATTERNS": "*.gguf"}
    settings = load_settings(MODEL, [], env)
    assert settings.allow_patterns == ("*.gguf",)
    assert not settings.patterns_are_default


def test_dataset_defaults_take_everything_into_workspace_dataset():
    settings = load_settings(DATASET, [], {"STORAGE_URI": "s3://b/d"})
    assert settings.allow_patterns == () and settings.ignore_patterns == ()
    assert settings.output == Path("/workspace/dataset")
    assert settings.region == "auto" and settings.workers == 16


def test_flags_win_over_env():
    env = {"STORAGE_URI": "s3://b/env", "OUTPUT_PATH": "/env", "WORKERS": "3"}
    settings = load_settings(
        DATASET, ["--storage-uri", "s3://b/flag", "--output", "/flag", "--workers", "5"], env
    )
    assert (settings.storage_uri, settings.output, settings.workers) == (
        "s3://b/flag",
        Path("/flag"),
        5,
    )


def test_kubeflow_names_come_before_aws_names():
    env = {
        "STORAGE_URI": "s3://b/d",
        "ENDPOINT": "http://kubeflow",
        "AWS_ENDPOINT_URL": "http://aws",
        "REGION": "eu-west-1",
        "AWS_REGION": "us-west-2",
        "ACCESS_KEY_ID": "kf",
        "AWS_ACCESS_KEY_ID": "aws",
        "SECRET_ACCESS_KEY": "s",
        "AWS_SECRET_ACCESS_KEY": "s2",
    }
    settings = load_settings(DATASET, [], env)
    assert (settings.endpoint, settings.region, settings.access_key_id) == (
        "http://kubeflow",
        "eu-west-1",
        "kf",
    )


def test_ecosystem_names_work_alone():
    env = {
        "STORAGE_URI": "s3://b/d",
        "AWS_ENDPOINT_URL_S3": "http://minio:9000",
        "AWS_DEFAULT_REGION": "us-east-2",
        "HF_TOKEN": "hf_x",
        "AWS_CA_BUNDLE": "/ca.pem",
    }
    settings = load_settings(DATASET, [], env)
    assert (settings.endpoint, settings.region, settings.token, settings.ca_bundle) == (
        "http://minio:9000",
        "us-east-2",
        "hf_x",
        "/ca.pem",
    )


def test_secret_files_are_read_and_stripped(tmp_path):
    (tmp_path / "secret").write_text("s3cr3t\n")
    (tmp_path / "token").write_text("hf_abc\n")
    settings = load_settings(
        DATASET,
        [
            "--secret-access-key-file",
            str(tmp_path / "secret"),
            "--token-file",
            str(tmp_path / "token"),
        ],
        {"STORAGE_URI": "s3://b/d", "ACCESS_KEY_ID": "id"},
    )
    assert (settings.secret_access_key, settings.token) == ("s3cr3t", "hf_abc")
    assert "s3cr3t" not in repr(settings) and "hf_abc" not in repr(settings)


def test_there_is_no_flag_that_takes_a_secret_on_the_command_line():
    with pytest.raises(UsageError, match="unrecognized arguments"):
        load_settings(DATASET, ["--secret-access-key", "x"], {"STORAGE_URI": "s3://b/d"})
    with pytest.raises(UsageError, match="unrecognized arguments"):
        load_settings(DATASET, ["--token", "x"], {"STORAGE_URI": "s3://b/d"})


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        ([], {}, "no source given"),
        ([], {"STORAGE_URI": "s3://b/" + "k" * 2100}, "at most 2048"),
        ([], {"STORAGE_URI": "s3://b/d", "WORKERS": "0"}, "invalid WORKERS"),
        ([], {"STORAGE_URI": "s3://b/d", "WORKERS": "many"}, "invalid WORKERS"),
        (["--timeout", "-1"], {"STORAGE_URI": "s3://b/d"}, "invalid --timeout"),
        ([], {"STORAGE_URI": "s3://b/d", "LOG_FORMAT": "xml"}, "must be 'text' or 'json'"),
        ([], {"STORAGE_URI": "s3://b/d", "ANONYMOUS": "perhaps"}, "expected true/false"),
        ([], {"STORAGE_URI": "s3://b/d", "ACCESS_KEY_ID": "id"}, "set both ACCESS_KEY_ID"),
        (
            ["--anonymous"],
            {"STORAGE_URI": "s3://b/d", "ROLE_ARN": "arn:aws:iam::1:role/r"},
            "--anonymous cannot be combined",
        ),
        ([], {"STORAGE_URI": "s3://b/d", "ALLOW_PATTERNS": ","}, "hold no pattern"),
        ([], {"STORAGE_URI": "s3://b/d", "IGNORE_PATTERNS": "[abc"}, "unclosed '['"),
        ([], {"STORAGE_URI": "s3://b/d", "ALLOW_PATTERNS": "/abs/*"}, "starts with '/'"),
        (["--token-file", "/no/such/file"], {"STORAGE_URI": "s3://b/d"}, "cannot read the"),
        (["--bogus"], {"STORAGE_URI": "s3://b/d"}, "unrecognized arguments"),
    ],
)
def test_bad_settings_raise_a_usage_error_naming_the_fix(argv, env, message):
    with pytest.raises(UsageError, match=None) as error:
        load_settings(DATASET, argv, env)
    assert message in str(error.value)


SPY_ON_THE_NATIVE_CLIENT = """
import builtins, os, sys
real_import = builtins.__import__
def spy(name, *args, **kwargs):
    if name.startswith("pyreqwest") and "pyreqwest" not in sys.modules:
        print("allocator set when the client loaded:", "MIMALLOC_PURGE_DELAY" in os.environ)
    return real_import(name, *args, **kwargs)
builtins.__import__ = spy
import initializers.{kind} as entry
print("loaded on import:", "pyreqwest" in sys.modules, flush=True)
entry.main(["--help"])
"""


@pytest.mark.parametrize("kind", ["dataset", "model"])
def test_the_native_clients_allocator_is_tuned_before_its_library_loads(kind: str) -> None:
    # mimalloc reads its options as the library loads: set later, they change nothing (the S3
    # dataset peaked ~55 MiB higher while the CLI set them after its imports).
    env = {k: v for k, v in os.environ.items() if not k.startswith("MIMALLOC_")}
    done = subprocess.run(
        [sys.executable, "-c", SPY_ON_THE_NATIVE_CLIENT.format(kind=kind)],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "loaded on import: False" in done.stdout
    assert "allocator set when the client loaded: True" in done.stdout

"""The options only the hf:// source receives: the Hub's endpoint, the revision, the token."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from initializers.options import Option, OptionGroup, read_secret_file


def _finish(values: dict[str, Any]) -> None:
    token_file = values.pop("token_file")
    if token_file is not None and not values["token"]:
        values["token"] = read_secret_file(token_file, "token")


OPTIONS = OptionGroup(
    "hf",
    "Hub",
    (
        Option(
            "revision",
            "--revision",
            ("REVISION",),
            "Hub branch, tag or commit (overrides @rev in the URI)",
            shown="`@rev` in the URI, else `main`",
        ),
        Option(
            "hf_endpoint",
            None,
            ("HF_ENDPOINT",),
            "Hugging Face Hub endpoint or mirror",
            shown="https://huggingface.co",
            locates=True,
        ),
        Option(
            "token",
            None,
            ("ACCESS_TOKEN", "HF_TOKEN"),
            "Hugging Face token (private and gated repos)",
            secret=True,
        ),
        Option(
            "token_file",
            "--token-file",
            ("ACCESS_TOKEN_FILE", "HF_TOKEN_PATH"),
            "file holding the Hugging Face token",
            Path,
        ),
    ),
    finish=_finish,
)

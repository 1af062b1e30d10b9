"""The real Hub client run as the benchmark's tests run it."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def snapshot_download_dataset(hub_url: str, work: Path) -> tuple[list[str], dict[str, str]]:
    """(argv, env) of ``snapshot_download`` of the bench dataset from ``hub_url`` into
    ``work/d``: the real client, over plain HTTP, nothing else in its way."""
    env = dict(
        os.environ,
        HF_ENDPOINT=hub_url,
        HF_HOME=str(work / "hf-home"),
        HF_HUB_DISABLE_XET="1",
        HF_HUB_DISABLE_PROGRESS_BARS="1",
    )
    code = (
        "import sys; from huggingface_hub import snapshot_download; "
        "snapshot_download('bench/dataset', repo_type='dataset', local_dir=sys.argv[1])"
    )
    return [sys.executable, "-c", code, str(work / "d")], env

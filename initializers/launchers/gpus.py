"""How many GPUs this container can see, without importing torch (which takes seconds).

Kubernetes' NVIDIA device plugin exposes only the allocated devices as ``/dev/nvidiaN``;
``CUDA_VISIBLE_DEVICES`` (when set) narrows that further, as CUDA itself does: entries up to the
first invalid one (``-1`` or empty) count.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

_NVIDIA_DEVICE = re.compile(r"nvidia\d+")


def visible_gpus(env: Mapping[str, str], dev: Path = Path("/dev")) -> int:
    """Number of CUDA devices a process started with ``env`` would see."""
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        count = 0
        for entry in visible.split(","):
            if not entry.strip() or entry.strip().startswith("-"):
                break
            count += 1
        return count
    try:
        return sum(1 for p in dev.iterdir() if _NVIDIA_DEVICE.fullmatch(p.name))
    except OSError:
        return 0

"""``dataset-initializer``: fetch a dataset into /workspace/dataset (or --output)."""

from __future__ import annotations

import sys
from pathlib import Path

from initializers.cli import run
from initializers.config import AssetDefaults

DEFAULTS = AssetDefaults(kind="dataset", output=Path("/workspace/dataset"))


def main(argv: list[str] | None = None) -> int:
    return run(DEFAULTS, argv)


if __name__ == "__main__":
    sys.exit(main())

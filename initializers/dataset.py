"""``dataset-initializer``: fetch a dataset into /workspace/dataset (or --output)."""

from __future__ import annotations

from pathlib import Path
from typing import NoReturn

from initializers.cli import main_for
from initializers.config import AssetDefaults

DEFAULTS = AssetDefaults(kind="dataset", output=Path("/workspace/dataset"))


def main(argv: list[str] | None = None) -> NoReturn:
    main_for(DEFAULTS, argv)


if __name__ == "__main__":
    main()

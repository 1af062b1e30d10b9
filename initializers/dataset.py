"""``dataset-initializer``: fetch a dataset into /workspace/dataset (or --output)."""

from __future__ import annotations

from pathlib import Path
from typing import NoReturn

from initializers.config import AssetDefaults
from initializers.entrypoint import run_initializer

DEFAULTS = AssetDefaults(kind="dataset", output=Path("/workspace/dataset"))


def main(argv: list[str] | None = None) -> NoReturn:
    run_initializer(DEFAULTS, argv)


if __name__ == "__main__":
    main()

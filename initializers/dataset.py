"""``dataset-initializer``: fetch a dataset into /workspace/dataset (or --output)."""

from __future__ import annotations

from pathlib import Path
from typing import NoReturn

from initializers.config import AssetDefaults
from initializers.environment import prepare_native_allocator

DEFAULTS = AssetDefaults(kind="dataset", output=Path("/workspace/dataset"))


def main(argv: list[str] | None = None) -> NoReturn:
    prepare_native_allocator()  # before the CLI's imports load the native client, which reads it
    from initializers.cli import main_for

    main_for(DEFAULTS, argv)


if __name__ == "__main__":
    main()

"""The initializers' console entry: tune the native client's allocator, load the CLI, tune the
cycle collector, run.

The order is the point: the CLI's imports load the native client, whose allocator reads its
options as it loads (:func:`initializers.environment.prepare_native_allocator`), so they are
set here, before the CLI is imported.
"""

from __future__ import annotations

from typing import NoReturn

from initializers.config import AssetDefaults
from initializers.environment import prepare_native_allocator, tune_garbage_collector


def run_initializer(defaults: AssetDefaults, argv: list[str] | None = None) -> NoReturn:
    """Run one initializer with ``defaults`` and end the process with its exit code."""
    prepare_native_allocator()
    from initializers.cli import main_for

    tune_garbage_collector()  # after the imports: what they made is frozen
    main_for(defaults, argv)

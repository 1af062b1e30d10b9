"""The process edge every entrypoint shares: its environment, read here and nowhere else, and the
one-line failure report Kubernetes shows.

The initializers, the cache tool and the launcher shims all read the environment through
:func:`variables` and parse booleans with :func:`parse_bool`; they write their failure line with
:func:`write_termination_message`. Nothing in the package writes to the environment at import:
:func:`prepare_native_allocator` does it, once, when an entrypoint starts.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
from collections.abc import Mapping
from pathlib import Path

DEFAULT_TERMINATION_LOG = Path("/dev/termination-log")


def variables() -> Mapping[str, str]:
    """The process environment, as the settings parsers read it."""
    return os.environ


def parse_bool(value: str) -> bool:
    """The one boolean parser: 1/true/yes/on and 0/false/no/off, any case; "" is false.
    Raises ValueError for anything else."""
    lowered = value.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"expected true/false, got {value!r}")


def is_on(env: Mapping[str, str], name: str) -> bool:
    """Whether the boolean variable ``name`` is set true; a value that is no boolean is off
    (for switches read where a bad value cannot be reported, such as a shim's DEBUG)."""
    try:
        return parse_bool(env.get(name, ""))
    except ValueError:
        return False


def write_termination_message(message: str, path: Path = DEFAULT_TERMINATION_LOG) -> None:
    """Write ``message`` where ``kubectl describe pod`` shows it. Kubernetes mounts the
    default file; it is never created (outside a pod, /dev/termination-log stays absent)."""
    if path == DEFAULT_TERMINATION_LOG and not path.exists():
        return
    with contextlib.suppress(OSError):
        path.write_text(message + "\n")


def prepare_native_allocator() -> None:
    """Tune the native HTTP client's allocator (mimalloc, bundled with it) before it loads, and
    glibc's for the rest.

    It commits its arenas eagerly and returns freed pages late; a body's buffers are allocated
    on the client's thread and freed on the loop's, so pages piled up: 168-176 MiB peak on the
    benchmark's S3 dataset (two processes, 24 requests in flight each, 20 ms before every first
    byte), 114-123 MiB with these, in the same time (paired rounds: 1.11x, 0.95-1.29). Read as
    the library loads, so the entrypoint (:mod:`initializers.entrypoint`) calls this before it
    imports the CLI, which loads the library: called from the CLI after its imports, for a
    month, they were set too late to count, and the S3 dataset (no delay) peaked at 193-208 MiB
    instead of the 135-142 it takes with them. A value the user set wins.
    """
    os.environ.setdefault("MIMALLOC_ARENA_EAGER_COMMIT", "0")
    os.environ.setdefault("MIMALLOC_PURGE_DELAY", "0")
    _limit_malloc_arenas()


def tune_garbage_collector() -> None:
    """Python's cycle collector, for a run that makes and drops some hundred objects a file.

    What the imports made is frozen out of it (it stays for the whole run), and a young
    collection waits for 10,000 new objects instead of 700. With the default, the 100,000
    small objects of ``make bench-manyfiles`` cost 3,800 young collections in the two
    processes, each going over the plan's window of jobs again: 1.7 s of CPU; with this, 105
    and 0.65 s (by ``gc.callbacks``). Nearly every object is freed by its count going to zero;
    the few cycles (a failed request's traceback) wait longer."""
    gc.freeze()
    gc.set_threshold(10_000, 10, 10)


M_ARENA_MAX = -8  # glibc's mallopt parameter
MALLOC_ARENAS = 2


def _limit_malloc_arenas() -> None:
    """Two glibc malloc arenas, not eight a core: a run's threads then reuse what each other
    freed instead of each keeping its own. Copying a million one-byte files, each process grew
    by some 16-20 MiB over the run with the default (59 to 75 MiB anonymous memory in the
    parent, 50 to 68 in the worker), and stayed within 52-56 and 44-48 with two. Python runs
    one thread at a time anyway. A MALLOC_ARENA_MAX the user set wins (glibc reads it itself);
    without glibc, nothing is done."""
    if "MALLOC_ARENA_MAX" in os.environ:
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).mallopt(M_ARENA_MAX, MALLOC_ARENAS)

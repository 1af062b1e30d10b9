"""The VM's free page reporting: measured as found by default, held back on request.

``make bench`` measures the kernel as it finds it (:func:`as_found`): a node's kernel is what
users get, and VM-sandboxed pods can have this device too. ``--hold-free-pages`` raises the
order for the session (a tuned variant, reported beside the default run, never instead of it).
What it changes: this machine is a VM whose balloon device reports free memory to the host
(``VIRTIO_BALLOON_F_REPORTING``; the kernel's ``page_reporting`` module, 2 MiB blocks). A block
reported is given back to the host, and whoever is handed it next pays the host's page faults on
first touch. Writing 2 GiB into the page cache took 0.39 s right after 2 GiB had been freed, and
2.9-3.9 s once the freed memory had sat for 4 s (``dd``, 4 runs); in two-contender sessions on
the S3 model, ours took 3.57-4.92 s at 5.2-7.2 CPU-seconds in every run that followed s5cmd's,
76% of its samples in the kernel's copy into the page cache, and 1.37-2.63 s otherwise (why
s5cmd after ours did not pay is not known). Nodes without the device never pay. Raised to its
highest order, the kernel reports only 4 MiB blocks: the same ``dd`` took 0.57 s after the 4 s
wait, and the same session ran ours in 1.89-2.07 s after every peer. Memory reported before the
session stays reported (the first run of a session can still pay). The order is put back when
the session ends; the report says what was done.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

PARAMETER = Path("/sys/module/page_reporting/parameters/page_reporting_order")
HIGHEST_ORDER = 10  # MAX_PAGE_ORDER of x86-64 and arm64 with 4 KiB pages: the kernel takes no more


@contextlib.contextmanager
def as_found(parameter: Path = PARAMETER) -> Iterator[str]:
    """Leave the reporting as it is; yields one line for the report saying what was found."""
    try:
        order = parameter.read_text().strip()
    except OSError:
        yield "not reported to the host (no page_reporting module)"
        return
    yield f"reported to the host in blocks of order {order}, as found"


@contextlib.contextmanager
def reporting_held_back(parameter: Path = PARAMETER) -> Iterator[str]:
    """Raise the order of the blocks the kernel reports to :data:`HIGHEST_ORDER` for the
    session, then put it back; yields one line for the report saying what was done."""
    try:
        before = parameter.read_text().strip()
    except OSError:
        yield "not reported to the host (no page_reporting module)"
        return
    if before == str(HIGHEST_ORDER):
        yield f"reported to the host in blocks of order {before}, as found"
        return
    try:
        parameter.write_text(f"{HIGHEST_ORDER}\n")
    except OSError as exc:
        yield (
            f"reported to the host in blocks of order {before}, left as found ({exc.strerror}): "
            "runs that follow a large free may be slowed unevenly"
        )
        return
    held = f"reported to the host in blocks of order {HIGHEST_ORDER} for the session"
    try:
        yield f"{held} (order {before} before)"
    finally:
        parameter.write_text(f"{before}\n")

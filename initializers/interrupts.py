"""One stop for every byte path: what SIGTERM calls so reads in flight end at once.

Each transport registers how its reads are cut (shut the sockets down, cancel native requests);
the signal handlers of the CLI and of the worker processes call :func:`interrupt_reads`, which
runs them all. Hooks run in a signal handler: they set flags and make non-blocking calls only.
"""

from __future__ import annotations

from collections.abc import Callable

_HOOKS: list[Callable[[], None]] = []
_stopped = False  # set once, never cleared: a stop is final (a plain flag: no lock in a handler)


def on_interrupt(hook: Callable[[], None]) -> Callable[[], None]:
    """Register ``hook`` (once) to run when the process is told to stop."""
    if hook not in _HOOKS:
        _HOOKS.append(hook)
    return hook


def interrupt_reads() -> None:
    """End every read in flight, and refuse the ones that would start after this."""
    global _stopped
    _stopped = True
    for hook in list(_HOOKS):
        hook()


def stopped() -> bool:
    """True once :func:`interrupt_reads` ran: a failed request is then the stop, not the
    network, and retrying it would only wait out the backoff."""
    return _stopped

"""Bounded waiting: call a check until it reports no problems or the time budget is spent.

Both shims wait for things (asset manifests, master port, sshd on every host); this is the one
place that decides how often to look and what to say while waiting, so the log shows the wait
started, what it is still waiting for when that changes, and a reminder now and then.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from tenacity import RetryCallState, Retrying, retry_if_result, stop_after_delay, wait_exponential

log = logging.getLogger(__name__)

Check = Callable[[], list[str]]

# Look again quickly at first (a node usually starts seconds after its peer), then every 2 s.
_WAIT = wait_exponential(multiplier=0.1, min=0.1, max=2.0)
REMIND_EVERY = 30.0


class _Narrator:
    """Logs the wait without flooding ``kubectl logs``: on change, and every REMIND_EVERY s."""

    def __init__(self, what: str, timeout: float, clock: Callable[[], float]) -> None:
        self.what = what
        self.timeout = timeout
        self.clock = clock
        self.started = clock()
        self.last_said: tuple[list[str], float] | None = None

    def __call__(self, state: RetryCallState) -> None:
        problems: list[str] = state.outcome.result() if state.outcome else []
        now = self.clock()
        if self.last_said is None:
            log.info("waiting up to %gs for %s: %s", self.timeout, self.what, _summary(problems))
        elif problems != self.last_said[0] or now - self.last_said[1] >= REMIND_EVERY:
            log.info(
                "still waiting for %s (%.0fs of %gs): %s",
                self.what,
                now - self.started,
                self.timeout,
                _summary(problems),
            )
        else:
            return
        self.last_said = (problems, now)


def _summary(problems: list[str], shown: int = 3) -> str:
    more = len(problems) - shown
    return "; ".join(problems[:shown]) + (f" (+{more} more)" if more > 0 else "")


def wait_until_ready(
    check: Check,
    *,
    what: str,
    timeout: float,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> list[str]:
    """Run ``check`` until it returns ``[]`` or ``timeout`` seconds pass; return its last answer.

    ``timeout`` 0 means look once. The caller turns a non-empty answer into its typed error.
    """
    narrator = _Narrator(what, timeout, clock)
    retrying = Retrying(
        stop=stop_after_delay(timeout),
        wait=_WAIT,
        retry=retry_if_result(bool),
        before_sleep=narrator,
        retry_error_callback=lambda state: state.outcome.result() if state.outcome else [],
        sleep=sleep,
    )
    problems: list[str] = retrying(check)
    if not problems and narrator.last_said is not None:
        log.info("ready after %.1fs: %s", clock() - narrator.started, what)
    return problems

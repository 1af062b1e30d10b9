"""The retry policy, defined once as values (tenacity), applied to every remote call.

Only :class:`~initializers.errors.TransientError` is retried; every other failure is final at
once. Both the number of attempts and the time spent are bounded, so a dead endpoint ends the
run with exit code 7 instead of hanging the pod.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential_jitter,
)

from initializers.errors import TransientError, UnavailableError

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 8
    max_seconds: float = 300.0
    initial_wait: float = 0.5
    max_wait: float = 10.0
    sleep: Callable[[float], None] = time.sleep

    def call(self, fn: Callable[[], T], what: str) -> T:
        """Run ``fn``, retrying transient failures; raise UnavailableError when they persist.

        The first attempt is a plain call: tenacity's bookkeeping (a ``Retrying`` and its state,
        44 µs a call measured here) is only set up once it fails: on a dataset of small files
        every file makes such a call.
        """
        started = time.monotonic()
        try:
            return fn()
        except TransientError as exc:
            failures = [exc]

        def again() -> T:  # attempt 1 is the failure already met; the rest call fn
            if failures:
                raise failures.pop()
            return fn()

        retrying = Retrying(
            stop=stop_after_attempt(self.attempts) | stop_after_delay(self.max_seconds),
            wait=wait_exponential_jitter(initial=self.initial_wait, max=self.max_wait),
            retry=retry_if_exception_type(TransientError),
            sleep=self.sleep,
            before_sleep=_log_retry,
            reraise=True,
        )
        try:
            return retrying(again)
        except TransientError as exc:
            spent = time.monotonic() - started
            raise UnavailableError(
                f"{exc} — still failing after {retrying.statistics.get('attempt_number', 1)} "
                f"attempts over {spent:.0f}s; check the endpoint is up and reachable, then rerun "
                f"(finished files are kept) [{what}]"
            ) from None


def _log_retry(state: RetryCallState) -> None:
    exc = state.outcome.exception() if state.outcome else None
    wait = state.next_action.sleep if state.next_action else 0.0
    log.warning("retrying in %.1fs (attempt %d): %s", wait, state.attempt_number, exc)

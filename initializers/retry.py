"""The retry policy, defined once as values (tenacity), applied to every remote call.

Only :class:`~initializers.errors.TransientError` is retried; every other failure is final at
once. Both the number of attempts and the time spent are bounded, so a dead endpoint ends the
run with exit code 7 instead of hanging the pod.

A call that moves bytes may report its progress: the budget then counts the attempts (and the
seconds) since the last attempt that advanced by at least :data:`PROGRESS_BYTES`. A flaky link
that keeps delivering finishes its range; a dead one still ends after ``attempts`` in a row. The
threshold keeps the total bounded too: a range of ``n`` bytes can restart its budget at most
``n / PROGRESS_BYTES`` times.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from tenacity import RetryCallState, Retrying, retry_if_exception_type

from initializers.errors import Interrupted, TransientError, UnavailableError
from initializers.interrupts import stopped

log = logging.getLogger(__name__)
T = TypeVar("T")

PROGRESS_BYTES = 1 << 20  # an attempt that got this far is progress: the budget starts again


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 8
    max_seconds: float = 300.0
    initial_wait: float = 0.5
    max_wait: float = 10.0
    sleep: Callable[[float], None] = time.sleep

    def call(
        self,
        fn: Callable[[], T],
        what: str,
        progress: Callable[[], int] | None = None,
        failed: TransientError | None = None,
    ) -> T:
        """Run ``fn``, retrying transient failures; raise UnavailableError when they persist.

        ``progress``, when given, returns how far the work has got (bytes): the budget is then
        counted from the last attempt that advanced it by :data:`PROGRESS_BYTES` or more.
        ``failed`` is a first attempt made elsewhere (the native loop's) that counts as one.

        The first attempt is a plain call: tenacity's bookkeeping (a ``Retrying`` and its state,
        44 µs a call measured here) is only set up once it fails: on a dataset of small files
        every file makes such a call.
        """
        started = time.monotonic()
        mark = progress() if progress else 0
        if failed is not None:
            failures = [failed]
        else:
            try:
                return _unless_stopped(fn)
            except TransientError as exc:
                failures = [exc]
        streak = _Streak(self, progress or (lambda: 0), mark, started)

        def again() -> T:  # attempt 1 is the failure already met; the rest call fn
            if failures:
                raise failures.pop()
            return _unless_stopped(fn)

        retrying = Retrying(
            after=streak.observe,
            stop=streak.exhausted,
            wait=streak.wait,
            retry=retry_if_exception_type(TransientError),
            sleep=self.sleep,
            before_sleep=streak.log_retry,
            reraise=True,
        )
        try:
            return retrying(again)
        except TransientError as exc:
            spent = time.monotonic() - streak.since
            raise UnavailableError(
                f"{exc} — still failing after {streak.length} "
                f"attempts over {spent:.0f}s; check the endpoint is up and reachable, then rerun "
                f"(finished files are kept) [{what}]"
            ) from None


def _unless_stopped(fn: Callable[[], T]) -> T:
    """``fn()``; a transient failure after a stop (SIGTERM cut the connection) is the stop."""
    try:
        return fn()
    except TransientError:
        if stopped():
            raise Interrupted(
                "stopped by a signal; rerun to resume (fetched bytes are kept)"
            ) from None
        raise


class _Streak:
    """The failed attempts since the last one that made progress: what the budget counts.

    Tenacity calls ``observe`` first after every failed attempt (its ``after`` hook), so
    ``exhausted`` and ``wait`` always see the streak including that attempt, whichever of the
    two tenacity evaluates first.
    """

    def __init__(
        self, policy: RetryPolicy, progress: Callable[[], int], mark: int, since: float
    ) -> None:
        self.policy = policy
        self.progress = progress
        self.mark = mark
        self.since = since
        self.first = 1  # the attempt number the streak started at
        self.length = 1

    def observe(self, state: RetryCallState) -> None:
        reached = self.progress()
        if reached - self.mark >= PROGRESS_BYTES:  # this attempt failed, but only after progress
            self.mark, self.first, self.since = reached, state.attempt_number, time.monotonic()
        self.length = state.attempt_number - self.first + 1

    def exhausted(self, state: RetryCallState) -> bool:
        spent = time.monotonic() - self.since
        return self.length >= self.policy.attempts or spent >= self.policy.max_seconds

    def wait(self, state: RetryCallState) -> float:
        """Exponential backoff with up to 1 s of jitter, from the start of the streak; or the
        wait the server asked for (``Retry-After``: a Hub rate limit, S3's SlowDown), within
        what is left of the retry window."""
        failure = state.outcome.exception() if state.outcome else None
        asked = getattr(failure, "retry_after", None)
        if asked is not None:
            left = self.policy.max_seconds - (time.monotonic() - self.since)
            return max(0.0, min(asked, left))
        backoff = self.policy.initial_wait * 2 ** (self.length - 1) + random.uniform(0, 1)
        return min(self.policy.max_wait, backoff)

    def log_retry(self, state: RetryCallState) -> None:
        """One line per retry; ``attempt N`` counts within the streak, as the budget does."""
        exc = state.outcome.exception() if state.outcome else None
        wait = state.next_action.sleep if state.next_action else 0.0
        log.warning("retrying in %.1fs (attempt %d): %s", wait, self.length, exc)

"""One rule says which HTTP answers are worth retrying, whichever source met them, and how long
a throttled answer asks to wait before the next attempt."""

from __future__ import annotations

import email.utils
import time

import pytest

from initializers.errors import AuthError, TransientError, UnavailableError
from initializers.httpstatus import is_transient, retry_after, status_error
from initializers.retry import RetryPolicy
from initializers.sources.s3errors import s3_error


@pytest.mark.parametrize("status", [408, 429, 500, 502, 503, 504, 507, 520, 524])
def test_timeouts_throttling_and_server_errors_are_retried_by_every_source(status):
    assert is_transient(status)
    assert isinstance(status_error(status, "f"), TransientError)
    assert isinstance(s3_error("", status, {}, "f", "b"), TransientError)
    assert isinstance(s3_error(str(status), status, {}, "f", "b"), TransientError)


@pytest.mark.parametrize("status", [400, 401, 403, 404, 412, 416, 501, 505])
def test_answers_that_cannot_get_better_are_final_at_once(status):
    assert not is_transient(status)
    assert not isinstance(status_error(status, "f"), TransientError)


def test_s3_names_its_throttling_whatever_the_status():
    assert isinstance(s3_error("SlowDown", 400, {}, "f", "b"), TransientError)
    assert isinstance(s3_error("AccessDenied", 403, {}, "f", "b"), AuthError)


def test_retry_after_is_read_in_seconds_or_as_an_http_date_and_ignored_when_neither():
    assert retry_after({"Retry-After": "7"}) == 7.0
    assert retry_after({"retry-after": "0"}) == 0.0  # botocore's headers are lower case
    in_a_minute = email.utils.formatdate(time.time() + 60, usegmt=True)
    assert 55 <= retry_after({"Retry-After": in_a_minute}) <= 60
    past = email.utils.formatdate(time.time() - 60, usegmt=True)
    assert retry_after({"Retry-After": past}) == 0.0
    assert retry_after({"Retry-After": "soon"}) is None
    assert retry_after({}) is None and retry_after(None) is None


def test_a_throttled_answer_carries_its_wait_whichever_source_met_it():
    for failure in (
        status_error(429, "f", {"Retry-After": "12"}),
        s3_error("SlowDown", 503, {"retry-after": "12"}, "f", "b"),
    ):
        assert isinstance(failure, TransientError) and failure.retry_after == 12.0
        assert "asked to retry after 12s" in str(failure)
    assert status_error(503, "f", {}).retry_after is None  # type: ignore[union-attr]


def _throttled_twice(asked: float):
    calls = []

    def fn() -> str:
        calls.append(time.monotonic())
        if len(calls) <= 2:
            raise TransientError("f: HTTP 429", retry_after=asked)
        return "done"

    return fn, calls


def test_the_wait_a_server_asks_for_replaces_the_backoff_even_beyond_its_cap():
    slept: list[float] = []
    fn, calls = _throttled_twice(asked=25.0)  # longer than the backoff's 10 s cap
    assert RetryPolicy(sleep=slept.append).call(fn, "f") == "done"
    assert slept == [25.0, 25.0] and len(calls) == 3


def test_a_wait_longer_than_the_retry_window_is_cut_to_what_is_left_of_it():
    slept: list[float] = []
    fn, _ = _throttled_twice(asked=3600.0)
    policy = RetryPolicy(attempts=2, max_seconds=30.0, sleep=slept.append)
    with pytest.raises(UnavailableError, match="still failing after 2 attempts"):
        policy.call(fn, "f")
    assert len(slept) == 1 and 29.0 <= slept[0] <= 30.0

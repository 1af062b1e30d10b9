"""One rule says which HTTP answers are worth retrying, whichever source met them."""

from __future__ import annotations

import pytest

from initializers.errors import AuthError, TransientError
from initializers.httpstatus import is_transient, status_error
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

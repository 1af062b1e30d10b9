"""The options only the http(s):// source receives: request headers."""

from __future__ import annotations

import json
import re

from initializers.options import Option, OptionGroup

_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # an RFC 9110 token


def parse_headers(value: str) -> tuple[tuple[str, str], ...]:
    """A JSON object of header names to string values (never echoed: they hold secrets)."""
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError:
        raise ValueError('expected a JSON object such as {"Authorization": "Bearer ..."}') from None
    if not isinstance(parsed, dict) or not all(
        isinstance(k, str) and _HEADER_NAME.match(k) and isinstance(v, str) and "\n" not in v
        for k, v in parsed.items()
    ):
        raise ValueError("expected a JSON object of header names to one-line string values")
    return tuple(parsed.items())


OPTIONS = OptionGroup(
    "http",
    "http(s)",
    (
        Option(
            "http_headers",
            None,
            ("HTTP_HEADERS",),
            "JSON object of request headers for http(s):// URIs, e.g. an Authorization header "
            "(never logged; not sent on to another host after a redirect)",
            parse_headers,
            default=(),
            secret=True,
        ),
    ),
)

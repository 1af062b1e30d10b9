"""The endpoints' nginx access log: one line per request, parsed, and which lines are file data.

Each line is ``LOG_FORMAT``: ``$msec`` is when nginx wrote it (the end of the response, epoch
seconds with millisecond resolution) and ``$request_time`` how long the request took from its
first byte read, so their difference is when the request arrived. That arrival, compared with
the time the harness started a contender, is the contender's delay to its first data GET.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

LOG_FORMAT = (
    "$msec $request_time $server_port $request_method $request_uri $status $body_bytes_sent"
)
# What each of the endpoints' ports is: an S3 endpoint, the Hub's API and resolve, its CDN.
ROLES = ("s3", "hub", "cdn")


@dataclass(frozen=True)
class Entry:
    """One request as nginx logged it."""

    ended: float  # epoch seconds
    duration: float  # seconds, from the request's first byte to the log line
    port: int
    method: str
    uri: str
    status: int
    body_bytes: int

    @property
    def arrived(self) -> float:
        """When the request's first byte reached nginx (epoch seconds, ±1 ms)."""
        return self.ended - self.duration

    @property
    def path(self) -> str:
        return self.uri.split("?", 1)[0]


def parse_line(line: str) -> Entry | None:
    """The entry of one ``LOG_FORMAT`` line; None for anything else (a torn or foreign line)."""
    fields = line.split()
    if len(fields) != 7:
        return None
    try:
        return Entry(
            ended=float(fields[0]),
            duration=float(fields[1]),
            port=int(fields[2]),
            method=fields[3],
            uri=fields[4],
            status=int(fields[5]),
            body_bytes=int(fields[6]),
        )
    except ValueError:
        return None


def read_since(log: Path, position: int) -> list[Entry]:
    """Every entry logged after byte ``position`` of ``log``."""
    if not log.exists():
        return []
    with open(log, "rb") as f:
        f.seek(position)
        text = f.read().decode(errors="replace")
    return [e for e in map(parse_line, text.splitlines()) if e is not None]


def is_data_get(entry: Entry, role: str) -> bool:
    """A GET of file bytes: an S3 object (``/bucket/key``), a Hub ``resolve``, any CDN GET.

    Listings, bucket requests and the Hub's API are not file data.
    """
    if entry.method != "GET":
        return False
    if role == "cdn":
        return True
    if role == "hub":
        return "/resolve/" in entry.path
    path = entry.path
    return path.count("/") >= 2 and not path.endswith("/")

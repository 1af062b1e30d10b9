"""The ``s3_server`` fixture: each server of the matrix, started once per session on 127.0.0.1.

Parametrized over :data:`tests.compat.matrix.SERVERS` (tests may narrow it with an indirect
parametrization). Each server is started once, on first use, and gets one bucket for the
session; every test works under its own prefix in it (SeaweedFS gives each bucket its own set
of volumes, so one bucket keeps it small).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from tests.compat import matrix
from tests.compat.servers import MotoS3, RcloneS3, S3Server, SeaweedFS, ServerError, client
from tests.conftest import Bucket

_prefixes = itertools.count()


class ServerPool:
    """Each server started on first use and kept for the session (all stopped at its end).

    Function-scoped lookups into this pool, rather than a session-scoped parametrized fixture,
    because an indirect parametrization of such a fixture would restart the server per test.
    """

    def __init__(self, request: pytest.FixtureRequest, tmp_path_factory) -> None:
        self._request = request
        self._tmp = tmp_path_factory
        self._running: dict[str, S3Server] = {}
        self._failed: dict[str, ServerError] = {}

    def get(self, name: str) -> S3Server:
        """The running server; a server that could not start fails every test that needs it,
        at once, with the reason it gave the first time."""
        if name in self._failed:
            raise self._failed[name]
        if name not in self._running:
            try:
                self._running[name] = server = self._start(name)
            except ServerError as exc:
                self._failed[name] = exc
                raise
            client(server.endpoint).create_bucket(Bucket="compat")  # type: ignore[attr-defined]
        return self._running[name]

    def _start(self, name: str) -> S3Server:
        if name == "moto":
            return MotoS3(self._request.getfixturevalue("s3_endpoint"))
        if name == "seaweedfs":
            return SeaweedFS(self._tmp.mktemp("seaweedfs"))
        if name == "rclone":
            return RcloneS3(self._tmp.mktemp("rclone"))
        raise ValueError(f"unknown S3 server {name!r}")

    def close(self) -> None:
        for server in self._running.values():
            server.close()


@pytest.fixture(scope="session")
def s3_servers(request: pytest.FixtureRequest, tmp_path_factory) -> Iterator[ServerPool]:
    pool = ServerPool(request, tmp_path_factory)
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture(params=matrix.SERVERS)
def s3_server(request: pytest.FixtureRequest, s3_servers: ServerPool) -> S3Server:
    """One server of the matrix (every one, unless a test parametrizes it indirectly)."""
    return s3_servers.get(request.param)


@pytest.fixture
def compat(s3_server: S3Server) -> Bucket:
    """The server's bucket, as tests/conftest.py's ``Bucket`` (its ``env`` feeds the CLI).
    Its client, which only sets up and inspects, retries as an SDK user would: SeaweedFS
    answered a burst of uploads with InternalError past boto3's default three attempts, once
    in a CI run."""
    scaffolding = client(s3_server.endpoint, retries={"mode": "standard", "max_attempts": 10})
    return Bucket("compat", scaffolding, s3_server.endpoint)


@pytest.fixture
def prefix() -> str:
    """A folder no other test of this session uses."""
    return f"t{next(_prefixes)}"

"""One fixture and one set of endpoints (real nginx, plain and delayed) for every test module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from benchmarks.endpoints import Endpoints
from benchmarks.fixtures import Fixture, load_or_generate

SCALE = 0.04  # shards of ~10 MiB (above the 8 MiB multipart threshold), 80 dataset files


@pytest.fixture(scope="session")
def fixture(tmp_path_factory: pytest.TempPathFactory) -> Fixture:
    return load_or_generate(tmp_path_factory.mktemp("bench"), SCALE, log=lambda _: None)


@pytest.fixture(scope="session")
def endpoints(fixture: Fixture, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Endpoints]:
    with Endpoints(fixture, tmp_path_factory.mktemp("run")) as eps:
        yield eps

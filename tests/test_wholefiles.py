"""The native loop's small-file fetcher (initializers.wholefiles): how much it keeps at once.

Driven with a source whose whole-file GET is served from memory on the loop, so what is
counted is the fetcher's own bookkeeping, not a server's pace."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator

from initializers.filejob import FileJob
from initializers.progress import Progress
from initializers.sources.base import RemoteFile
from initializers.wholefiles import fetch_whole_files

FILES = 400
IN_FLIGHT = 4


class _Body:
    def __init__(self, data: bytes) -> None:
        self.headers: dict[str, str] = {}
        self._data = data

    async def chunks(self) -> AsyncIterator[memoryview]:
        await asyncio.sleep(0)  # the body arrives later, as from a connection
        yield memoryview(self._data)


class MemorySource:
    """Whole files from memory; notes the most tasks and requests alive at once."""

    fetches_whole = True

    def __init__(self) -> None:
        self.open_now = self.most_open = self.most_tasks = 0
        self.asked: list[str] = []  # the files, in the order their requests went out

    @contextlib.asynccontextmanager
    async def fetch_whole(self, file: RemoteFile) -> AsyncIterator[_Body]:
        self.asked.append(file.path)
        self.open_now += 1
        self.most_open = max(self.most_open, self.open_now)
        self.most_tasks = max(self.most_tasks, len(asyncio.all_tasks()))
        try:
            await asyncio.sleep(0)  # waiting for the first byte
            yield _Body(file.path.encode())
        finally:
            self.open_now -= 1

    def checksum_for(self, file: RemoteFile, headers: object) -> None:
        return None


def _jobs(dest) -> list[FileJob]:
    jobs = []
    for i in range(FILES):
        name = f"f{i:03d}"
        job = FileJob(RemoteFile(path=name, size=len(name), version=None), dest)
        job.plan()
        jobs.append(job)
    return jobs


def test_four_hundred_files_cost_a_task_per_request_slot_not_a_task_per_file(tmp_path):
    source, jobs, fetched = MemorySource(), _jobs(tmp_path), []

    def done(job: FileJob) -> None:
        fetched.append(job.remote.path)
        job.close()

    def failed(job: FileJob, exc: Exception) -> None:
        raise exc

    asyncio.run(
        fetch_whole_files(
            source,  # type: ignore[arg-type]
            jobs,
            in_flight=IN_FLIGHT,
            stop=threading.Event(),
            progress=Progress(FILES, 0, 0),
            fetched=done,
            failed=failed,  # type: ignore[arg-type]
        )
    )
    assert source.asked == [job.remote.path for job in jobs]  # taken in order...
    assert sorted(fetched) == source.asked  # ...and each fetched once
    assert all((tmp_path / f".{p}.part").read_bytes() == p.encode() for p in fetched)
    assert source.most_open == IN_FLIGHT
    assert source.most_tasks <= IN_FLIGHT + 1  # the requesters, and the run's own task


def test_a_window_of_tiny_files_keeps_four_times_as_many_in_flight_up_to_a_cap():
    from initializers.inflight import (
        LOOP_PER_WORKER,
        MAX_BODIES_IN_FLIGHT,
        TINY_BODY,
        TINY_IN_FLIGHT,
        loop_in_flight,
    )

    tiny, small = [4096] * 95 + [TINY_BODY + 1] * 5, [4096] * 85 + [TINY_BODY + 1] * 15
    assert loop_in_flight(2, tiny) == 4 * 2 * LOOP_PER_WORKER  # nine in ten tiny
    assert loop_in_flight(2, small) == 2 * LOOP_PER_WORKER  # fewer: as any small file
    assert loop_in_flight(8, small) == MAX_BODIES_IN_FLIGHT
    assert loop_in_flight(8, tiny) == TINY_IN_FLIGHT
    assert loop_in_flight(64, tiny) == TINY_IN_FLIGHT

"""The native loop's small-file fetcher (initializers.wholefiles): how much it keeps at once.

Driven with a source whose whole-file GET is served from memory on the loop, so what is
counted is the fetcher's own bookkeeping, not a server's pace."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator

from initializers.errors import LocalStorageError
from initializers.filejob import FileJob
from initializers.progress import Progress
from initializers.sources.base import RemoteFile
from initializers.wholefiles import AHEAD, fetch_whole_files

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

    _fetch(source, jobs, threading.Event(), done, failed)
    assert source.asked == [job.remote.path for job in jobs]  # taken in order...
    assert sorted(fetched) == source.asked  # ...and each fetched once
    assert all((tmp_path / f".{p}.part").read_bytes() == p.encode() for p in fetched)
    assert source.most_open == IN_FLIGHT
    assert source.most_tasks <= IN_FLIGHT + 1  # the requesters, and the run's own task


def _fetch(source, jobs, stop, fetched, failed) -> None:
    asyncio.run(
        fetch_whole_files(
            source,
            jobs,
            in_flight=IN_FLIGHT,
            stop=stop,
            progress=Progress(len(jobs), 0, 0),
            fetched=fetched,
            failed=failed,
        )
    )


def test_a_part_that_cannot_be_made_ahead_hands_its_file_to_the_workers_with_the_error(tmp_path):
    source, jobs = MemorySource(), _jobs(tmp_path)
    (tmp_path / ".f123.part").mkdir()  # in the way: no file can be made there
    fetched: list[str] = []
    failures: dict[str, Exception] = {}

    def done(job: FileJob) -> None:
        fetched.append(job.remote.path)
        job.close()

    def failed(job: FileJob, exc: Exception) -> None:
        failures[job.remote.path] = exc

    _fetch(source, jobs, threading.Event(), done, failed)

    assert list(failures) == ["f123"]
    assert isinstance(failures["f123"], LocalStorageError)
    assert "f123" in str(failures["f123"])
    assert sorted(fetched) == [job.remote.path for job in jobs if job.remote.path != "f123"]


def test_after_a_stop_no_part_is_made_once_the_fetch_has_returned(tmp_path):
    source, jobs, stop = MemorySource(), _jobs(tmp_path), threading.Event()

    def done(job: FileJob) -> None:
        if job.remote.path == "f010":
            stop.set()
        job.close()

    _fetch(source, jobs, stop, done, lambda job, exc: None)
    made = sorted(p.name for p in tmp_path.glob(".*.part"))
    for job in jobs:
        job.close()
    time.sleep(0.2)  # an opener still running would make more

    assert sorted(p.name for p in tmp_path.glob(".*.part")) == made
    assert len(made) < 10 + AHEAD + IN_FLIGHT  # made ahead of the requests, not all 400


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

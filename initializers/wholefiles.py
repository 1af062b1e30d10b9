"""Small files fetched whole on the native event loop: each one's request, body and write.

Why: with a thread per small file, every system call hands the GIL from one thread to another;
the benchmark's 2,002-file S3 dataset made ~200,000 ``futex`` calls (s5cmd ~1,500), and that,
not HTTP, was what was left between this engine and s5cmd. Here one loop thread per process
keeps ``in_flight`` GETs open in Rust (:mod:`initializers.native`), and writes and digests each
body piece by piece as it arrives. A file whose digest matches is queued for its batch's commit
right there (:mod:`initializers.commits`, whose fsyncs run on a thread of their own): no thread
hand-off per file. Only a mismatch goes to a worker, which fetches the file again.

A file this first attempt cannot fetch is handed to the workers' path with its failure: a final
one (a 404, a refusal) ends the run as it would have there, a transient one is retried there
with this attempt counted in the budget, anything else (a full disk) is met again and reported
there. So retries, their budget and every message stay in one place.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from functools import partial

from initializers.checksum import new_digest
from initializers.filejob import FileJob
from initializers.fsutil import PIECE_WRITE_SIZE, write_all
from initializers.progress import Progress
from initializers.sources.base import Source

BACKLOG = 96  # files fetched but not yet committed, beyond the requests in flight
AHEAD = 64  # .parts made ahead of the requests, at most; the opener wakes once per half


async def fetch_whole_files(
    source: Source,
    jobs: list[FileJob],
    *,
    in_flight: int,
    stop: threading.Event,
    progress: Progress,
    fetched: Callable[[FileJob], Future[None] | None],
    failed: Callable[[FileJob, Exception], Future[None]],
) -> None:
    """Fetch each job's whole file into its ``.part``, ``in_flight`` at a time, in order; then
    hand it to ``fetched`` (to verify and commit, without blocking), or, when anything went
    wrong, to ``failed`` with the failure (the workers' way decides what it means). Each
    returns the future of work it handed to a worker, if any: files handed on but not done
    with are bounded too, as each holds its ``.part`` open."""
    backlog = asyncio.Semaphore(in_flight + BACKLOG)
    loop = asyncio.get_running_loop()
    waiting = enumerate(jobs)  # shared by the requesters: each job is taken once, in order
    parts = OpenAhead(jobs, stop, loop)

    def release_when_done(future: Future[None]) -> None:
        future.add_done_callback(lambda _: loop.call_soon_threadsafe(backlog.release))

    async def requester() -> None:
        """One of ``in_flight``: a task per request slot, not per file (a task per file cost
        ~18 ms before the first request on the benchmark's 1,000 files a process)."""
        for index, job in waiting:
            await backlog.acquire()
            parts.taken(index)
            handed: Future[None] | None = None
            try:
                handed = await _fetch_one(
                    source, job, index, parts, stop, progress, fetched, failed
                )
            finally:
                if handed is None:
                    backlog.release()
                else:
                    release_when_done(handed)
            # The pieces other requests have read go first: sending the next request at once
            # cost 5-10% more CPU in paired rounds on the S3 dataset (3 runs of 8).
            await asyncio.sleep(0)

    parts.start()
    try:
        await asyncio.gather(*(requester() for _ in range(min(in_flight, len(jobs)))))
    finally:
        parts.close()  # nothing is opened once this returns: the caller closes the jobs


class OpenAhead:
    """Makes the ``.part``s of ``jobs`` in order on a thread of its own, up to :data:`AHEAD`
    beyond the last one a request was sent for, so each is ready when its body arrives.

    A create can wait on the filesystem: ~0.4 ms for ours and s5cmd's alike where this VM's ext4
    (no journal) searched past inodes just freed, and a round trip on an NFS volume; the loop
    thread spent that blocked, file after file (the S3 dataset: 1.93 → 1.77 s there, when each
    create went to a worker with the request). One thread running ahead, woken once per half
    of :data:`AHEAD`, costs no hand-off per file: on 20,000 files of 1-8 KiB the pool's eight
    threads had made ~5 context switches a file. A create that failed here is left to the
    loop, which meets it again (:meth:`opened`) and hands the file to the workers' path."""

    def __init__(
        self, jobs: list[FileJob], stop: threading.Event, loop: asyncio.AbstractEventLoop
    ) -> None:
        self._jobs, self._stop, self._loop = jobs, stop, loop
        self._turn = threading.Condition(threading.Lock())  # the opener sleeps and wakes on it
        self._next = 0  # the next job to open (the opener thread's)
        self._limit = min(AHEAD, len(jobs))  # where it stops until requests catch up
        self._closed = False
        self._waiting: dict[int, asyncio.Future[None]] = {}
        self._thread = threading.Thread(target=self._run, name="open-ahead", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        with self._turn:
            self._closed = True
            self._turn.notify()
        self._thread.join()

    def taken(self, index: int) -> None:
        """A request for job ``index`` is going out: the opener may go on to ``index + AHEAD``.
        It is woken (under the lock, so no wake-up is lost) once it is half that far behind,
        or the last jobs are near; requests may report out of order, and a limit never moves
        back."""
        limit = min(index + 1 + AHEAD, len(self._jobs))
        if limit - self._next >= AHEAD // 2 or limit == len(self._jobs):
            with self._turn:
                self._limit = max(self._limit, limit)
                self._turn.notify()
        elif limit > self._limit:
            self._limit = limit  # seen at the opener's next look; it is not far behind

    async def passed(self, index: int) -> None:
        """Wait until the opener is past job ``index``: its ``.part`` made, or refused."""
        if self._jobs[index].fd is not None:
            return
        with self._turn:
            waited = None if index < self._next else self._loop.create_future()
            if waited is not None:
                self._waiting[index] = waited
        if waited is not None:
            await waited

    async def opened(self, index: int) -> int:
        """Job ``index``'s ``.part`` descriptor, once made; after a failure there, the loop
        tries once more (``FileJob.open`` makes it only if it is not made), and raises what it
        meets."""
        await self.passed(index)
        return self._jobs[index].open()

    def _run(self) -> None:
        jobs = self._jobs
        while True:
            with self._turn:
                while self._next >= self._limit and not self._closed:
                    self._turn.wait()
                if self._closed:
                    return
                index = self._next
            if not self._stop.is_set():
                with contextlib.suppress(Exception):  # met again by the loop (opened)
                    jobs[index].open()
            with self._turn:
                self._next = index + 1
                waited = self._waiting.pop(index, None)
            if waited is not None:
                self._loop.call_soon_threadsafe(_done, waited)
            if index + 1 == len(jobs):
                return


def _done(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def _fetch_one(
    source: Source,
    job: FileJob,
    index: int,
    parts: OpenAhead,
    stop: threading.Event,
    progress: Progress,
    fetched: Callable[[FileJob], Future[None] | None],
    failed: Callable[[FileJob, Exception], Future[None]],
) -> Future[None] | None:
    """Job ``index`` whole into its ``.part`` (which ``parts`` makes), digested as it streams;
    then handed on."""
    if stop.is_set():
        return None
    try:
        size = await _stream_into(source, job, partial(parts.opened, index), stop)
    except Exception as exc:
        await parts.passed(index)  # made, or refused, before the job moves on
        return failed(job, exc)
    if size is None:
        return None
    progress.add_bytes(size)
    try:
        return fetched(job)
    except Exception as exc:
        return failed(job, exc)


async def _stream_into(
    source: Source, job: FileJob, opening: Callable[[], Awaitable[int]], stop: threading.Event
) -> int | None:
    """The body into the ``.part`` ``opening`` gives; its size, or None after a stop."""
    async with source.fetch_whole(job.remote) as response:
        job.note_headers(response.headers)
        expected = job.expected_checksum(source)
        digest = (
            new_digest(expected.algorithm, job.remote.size, expected.parts) if expected else None
        )
        fd, offset = await opening(), 0
        async for chunk in response.chunks():
            if stop.is_set():
                return None
            write_all(fd, chunk, offset, PIECE_WRITE_SIZE)
            if digest is not None:
                digest.update(chunk)
            offset += len(chunk)
    if digest is not None:
        job.streamed_digest = digest.finish()
    return offset

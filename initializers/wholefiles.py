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
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future

from initializers.checksum import new_digest
from initializers.filejob import FileJob
from initializers.fsutil import PIECE_WRITE_SIZE, write_all
from initializers.progress import Progress
from initializers.sources.base import Source

BACKLOG = 96  # files fetched but not yet committed, beyond the requests in flight


async def fetch_whole_files(
    source: Source,
    jobs: list[FileJob],
    *,
    in_flight: int,
    stop: threading.Event,
    progress: Progress,
    fetched: Callable[[FileJob], Future[None] | None],
    failed: Callable[[FileJob, Exception], Future[None]],
    opener: Executor,
) -> None:
    """Fetch each job's whole file into its ``.part``, ``in_flight`` at a time, in order; then
    hand it to ``fetched`` (to verify and commit, without blocking), or, when anything went
    wrong, to ``failed`` with the failure (the workers' way decides what it means). Each
    returns the future of work it handed to a worker, if any: files handed on but not done
    with are bounded too, as each holds its ``.part`` open. ``opener`` makes the ``.part``s."""
    backlog = asyncio.Semaphore(in_flight + BACKLOG)
    loop = asyncio.get_running_loop()
    waiting = iter(jobs)  # shared by the requesters: each job is taken once, in order

    def release_when_done(future: Future[None]) -> None:
        future.add_done_callback(lambda _: loop.call_soon_threadsafe(backlog.release))

    async def requester() -> None:
        """One of ``in_flight``: a task per request slot, not per file (a task per file cost
        ~18 ms before the first request on the benchmark's 1,000 files a process)."""
        for job in waiting:
            await backlog.acquire()
            handed: Future[None] | None = None
            try:
                handed = await _fetch_one(source, job, stop, progress, fetched, failed, opener)
            finally:
                if handed is None:
                    backlog.release()
                else:
                    release_when_done(handed)
            # The pieces other requests have read go first: sending the next request at once
            # cost 5-10% more CPU in paired rounds on the S3 dataset (3 runs of 8).
            await asyncio.sleep(0)

    await asyncio.gather(*(requester() for _ in range(min(in_flight, len(jobs)))))


async def _fetch_one(
    source: Source,
    job: FileJob,
    stop: threading.Event,
    progress: Progress,
    fetched: Callable[[FileJob], Future[None] | None],
    failed: Callable[[FileJob, Exception], Future[None]],
    opener: Executor,
) -> Future[None] | None:
    """One whole file into its ``.part``, digested as it streams; then handed on.

    The ``.part`` is made (its folder readied, its final name checked) on a thread of
    ``opener`` while the request waits for its answer. A create can wait on the filesystem:
    ~0.4 ms for ours and s5cmd's alike where this VM's ext4 (no journal) searched past inodes
    just freed, and a round trip on an NFS volume; the loop thread spent that blocked, file
    after file (the S3 dataset: 1.93 → 1.77 s there; no change where creates are quick)."""
    if stop.is_set():
        return None
    opening = asyncio.get_running_loop().run_in_executor(opener, job.open)
    try:
        try:
            size = await _stream_into(source, job, opening, stop)
        finally:
            await _settled(opening)  # made, or refused, before the job moves on
    except Exception as exc:
        return failed(job, exc)
    if size is None:
        return None
    progress.add_bytes(size)
    try:
        return fetched(job)
    except Exception as exc:
        return failed(job, exc)


async def _stream_into(
    source: Source, job: FileJob, opening: asyncio.Future[int], stop: threading.Event
) -> int | None:
    """The body into the ``.part`` ``opening`` gives; its size, or None after a stop."""
    async with source.fetch_whole(job.remote) as response:
        job.note_headers(response.headers)
        expected = job.expected_checksum(source)
        digest = (
            new_digest(expected.algorithm, job.remote.size, expected.parts) if expected else None
        )
        fd, offset = await opening, 0
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


async def _settled(opening: asyncio.Future[int]) -> None:
    """Wait for ``opening`` to end; its failure, if the fetch never asked for its result, is
    the worker path's to meet again (it opens the same ``.part``)."""
    await asyncio.wait([opening])
    if not opening.cancelled():
        opening.exception()  # looked at: not logged as never retrieved

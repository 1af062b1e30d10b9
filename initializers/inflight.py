"""How many requests the engine keeps in flight, and so how many connections a source pools.

The engine's scheduling decides these; the sources size their connection pools from
:func:`connections_for`, which the run hands them with their options, so the workers setting
reaches the transports only through the engine's rule.
"""

from __future__ import annotations

MIB = 1 << 20

# A request for a small body spends most of its life waiting for the first byte (S3 and CDNs take
# 10-50 ms; the body itself is a millisecond at 1 GB/s), so small files keep this many times the
# workers' requests in flight while large ranges stay at ``workers`` (more of those only slowed
# the S3 model); the HTTP transports pool a connection for each. Throwaway paired rounds against
# s5cmd on the benchmark's S3 dataset with 20 ms before every first byte (5 rounds each, a quiet
# machine): ours 3.5-3.8 s at 1x, 2.5-2.9 s at 2x or 3x (median ratio 0.46 -> 0.60, 0.63);
# without the delay 3x cost ~5% (0.70 -> 0.66). On the Hub dataset (read ahead natively too) 3x
# against 1x: 0.83 -> 0.90 with the delay, 0.86 -> 0.83 without.
SMALL_IN_FLIGHT = 3
SMALL_BODY = MIB  # a range this small runs on the small files' pool (SMALL_IN_FLIGHT)

# Small files in flight on a process's native loop: LOOP_PER_WORKER a worker (they cost no
# thread), at most MAX_BODIES_IN_FLIGHT. Each costs ~0.5-1 MiB of the client's buffers, not its
# body, which is streamed. Paired rounds with 20 ms before every first byte, two processes (the
# default 16 workers): on the S3 dataset 24 a process were 1.22x (1.19-1.24) faster than 12 and
# 48 1.10x (1.02-1.18) faster than 24; on the Hub dataset 48 were 1.06x (1.00-1.12) faster
# than 32 but peaked at 190-199 MiB (32: 158-173), too close to the 200 MiB target. At 37eb981,
# 64 a process took the same time on both datasets with 20 ms (2 pairs each) for 70-80 MiB more:
# there, too, the CPU binds before the requests in flight do.
LOOP_PER_WORKER = 4
MAX_BODIES_IN_FLIGHT = 32
# A window whose files are nearly all this small (a raw image dataset: objects of a few KiB)
# keeps up to TINY_IN_FLIGHT of them in flight a process instead: each request is nothing but
# its wait for the first byte, its buffers a few KiB. At 32 a process, 100,000 objects of
# 1-8 KiB with 20 ms before every first byte could go no faster than 64 requests every 20 ms
# (31 s for two processes; s5cmd, 256 in flight, took 36 s): 0.70x s5cmd (0.63-0.81) at
# fa35aca. At 128, 1.17x (0.92-1.23), peak 118 MiB instead of 98 (bench-manyfiles, 5 paired
# rounds at df64bb0 with this change); 10,000 objects without the delay 0.94x (0.91-1.08).
TINY_BODY = 64 << 10
TINY_IN_FLIGHT = 128


def loop_in_flight(workers: int, sizes: list[int]) -> int:
    """Small files a process keeps in flight on its native loop for a window of files of
    ``sizes``: more when nine in ten of them are tiny."""
    usual = min(workers * LOOP_PER_WORKER, MAX_BODIES_IN_FLIGHT)
    if not sizes or sorted(sizes)[len(sizes) * 9 // 10] > TINY_BODY:
        return usual
    return max(usual, min(workers * LOOP_PER_WORKER * 4, TINY_IN_FLIGHT))


def connections_for(workers: int) -> int:
    """Connections a source's HTTP pool keeps: one for every request the engine may have in
    flight. A smaller pool opened connections that served one request each, then logged
    "Connection pool is full, discarding connection" as it closed them."""
    return workers * SMALL_IN_FLIGHT

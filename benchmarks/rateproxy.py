"""A TCP proxy with one bandwidth cap shared by all of its connections: one node's NIC.

The sharding scenario (``shards-s3-dataset``) puts one of these in front of nginx's S3 port for
every shard, and points that shard's ``ENDPOINT`` at it. The bytes from nginx to the client pass
through one token bucket per proxy, shared by every connection the proxy relays: a client that
opens 16 connections gets the cap, not 16 times it. The bucket is a virtual clock (GCRA): each
chunk read from nginx reserves ``len / rate`` seconds on it and is written when its slot ends,
and the clock may lag the wall clock by at most ``BURST`` bytes' worth. So from any start, the
bytes a proxy passes in ``T`` seconds are at most ``rate * T`` plus one burst and one chunk
(1.25 MiB), whatever the number of connections. Requests (client to nginx) are a few hundred bytes
and are not capped. The proxy relays bytes and parses nothing: a client's keep-alive connection is
one connection to nginx, and nginx's access log still counts every body it sent.

Run as ``python -m benchmarks.rateproxy --upstream 127.0.0.1:PORT --rate MIB_S --ready FILE``
(rate 0: no cap); :class:`RateProxy` starts one as its own process, so its CPU is measured apart
from the contenders' and from nginx's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

KiB, MiB = 1 << 10, 1 << 20
CHUNK = 256 * KiB  # the most one read from nginx returns (asyncio's transports read 256 KiB)
# How far the bucket may fill while idle: 50 ms at 20 MiB/s, so a proxy woken a little late on
# a busy machine does not lose its share, while a run's total stays within 1 MiB of the cap.
BURST = 1 * MiB
REPO_ROOT = Path(__file__).resolve().parent.parent


class Bucket:
    """The shared cap: ``delay(n, now)`` reserves ``n`` bytes and says how long to wait first."""

    def __init__(self, rate: float, burst: int = BURST, now: float = 0.0) -> None:
        if rate <= 0:
            raise ValueError("the rate must be positive")
        self.rate = rate  # bytes per second
        self.burst = burst
        self._clock = now  # when the bytes reserved so far have all been paid for

    def delay(self, n: int, now: float) -> float:
        self._clock = max(self._clock, now - self.burst / self.rate) + n / self.rate
        return max(0.0, self._clock - now)


class _Client(asyncio.Protocol):
    """The client's side of one relayed connection: requests go straight on to nginx."""

    def __init__(self, relay: Relay) -> None:
        self.relay = relay
        self.transport: asyncio.Transport | None = None
        self.upstream: _Upstream | None = None
        self.pending: list[bytes] = []  # what the client sent before nginx's side was up

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.relay.connections += 1
        asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        assert self.transport is not None
        try:
            _t, upstream = await loop.create_connection(
                lambda: _Upstream(self.relay, self), *self.relay.upstream
            )
        except OSError:
            self.transport.close()
            return
        if self.transport.is_closing():
            upstream.transport.close()
            return
        self.upstream = upstream
        for data in self.pending:
            upstream.transport.write(data)
        self.pending.clear()

    def data_received(self, data: bytes) -> None:
        if self.upstream is None:
            self.pending.append(data)
        else:
            self.upstream.transport.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.upstream is not None:
            self.upstream.transport.close()

    # The client reads slower than nginx sends: stop reading from nginx until it catches up.
    def pause_writing(self) -> None:
        if self.upstream is not None:
            self.upstream.hold("client")

    def resume_writing(self) -> None:
        if self.upstream is not None:
            self.upstream.release("client")


class _Upstream(asyncio.Protocol):
    """nginx's side: each chunk it sends waits for its slot in the bucket, then goes on. While a
    chunk waits, nothing more is read from nginx (its bytes queue in the kernel, as on a NIC)."""

    def __init__(self, relay: Relay, client: _Client) -> None:
        self.relay = relay
        self.client = client
        self.transport: asyncio.Transport
        self.holds: set[str] = set()
        self.waiting: bytes | None = None
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        loop = asyncio.get_running_loop()
        bucket = self.relay.bucket
        wait = bucket.delay(len(data), loop.time()) if bucket is not None else 0.0
        if wait <= 0:
            self._send(data)
            return
        self.waiting = data
        self.hold("bucket")
        loop.call_later(wait, self._due)

    def _due(self) -> None:
        data, self.waiting = self.waiting, None
        if data is not None:
            self._send(data)
        if self.lost:
            self._close_client()
        else:
            self.release("bucket")

    def _send(self, data: bytes) -> None:
        transport = self.client.transport
        if transport is not None and not transport.is_closing():
            transport.write(data)
            self.relay.bytes_down += len(data)

    def _close_client(self) -> None:
        if self.client.transport is not None:
            self.client.transport.close()

    def hold(self, why: str) -> None:
        if not self.holds:
            self.transport.pause_reading()
        self.holds.add(why)

    def release(self, why: str) -> None:
        self.holds.discard(why)
        if not self.holds:
            self.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.waiting is None:  # else the chunk still waiting goes out first
            self._close_client()


class Relay:
    """The proxy itself, in one asyncio loop: every connection relayed to ``upstream``."""

    def __init__(self, upstream: tuple[str, int], rate: float | None) -> None:
        self.upstream = upstream
        self.bucket = Bucket(rate, now=time.monotonic()) if rate else None
        self.bytes_down = 0
        self.connections = 0

    async def serve(self, ready: Path) -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: _Client(self), "127.0.0.1", 0, backlog=1024)
        port = server.sockets[0].getsockname()[1]
        tmp = ready.with_name(ready.name + ".tmp")
        tmp.write_text(json.dumps({"port": port, "pid": os.getpid()}))
        os.replace(tmp, ready)
        async with server:
            await server.serve_forever()


class RateProxy:
    """One proxy process in front of ``upstream`` (``http://host:port``), capped at
    ``rate_mib_s`` (None: uncapped); use as a context manager."""

    def __init__(self, upstream: str, rate_mib_s: float | None, run_dir: Path) -> None:
        self.upstream = upstream.removeprefix("http://").rstrip("/")
        self.rate_mib_s = rate_mib_s
        self.run_dir = run_dir
        self.port = 0
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> RateProxy:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        ready = self.run_dir / f"rateproxy-{id(self)}.json"
        ready.unlink(missing_ok=True)
        argv = [
            sys.executable, "-m", "benchmarks.rateproxy", "--upstream", self.upstream,
            "--rate", str(self.rate_mib_s or 0), "--ready", str(ready),
        ]  # fmt: skip
        self.proc = subprocess.Popen(argv, cwd=REPO_ROOT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while not ready.exists():
            if self.proc.poll() is not None:
                raise RuntimeError(f"the rate proxy exited with {self.proc.returncode}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("the rate proxy did not come up in 30 s")
            time.sleep(0.02)
        self.port = json.loads(ready.read_text())["port"]
        ready.unlink()

    def cpu_s(self) -> float:
        """User + system CPU seconds the proxy process has used so far."""
        import psutil

        assert self.proc is not None
        times = psutil.Process(self.proc.pid).cpu_times()
        return times.user + times.system

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.rateproxy", description=__doc__)
    p.add_argument("--upstream", required=True, help="host:port to relay to")
    p.add_argument("--rate", type=float, default=0, help="MiB/s for all connections (0: no cap)")
    p.add_argument("--ready", type=Path, required=True, help="where to write the port, when up")
    args = p.parse_args(argv)
    host, _, port = args.upstream.rpartition(":")
    relay = Relay((host, int(port)), args.rate * MiB if args.rate > 0 else None)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(relay.serve(args.ready))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The fault proxy itself: each fault really happens on the wire, as a client sees it.

The reliability specs are only as good as the faults they inject; these pin down what each one
does to a plain HTTP client (urllib3, no retries) fetching an object from moto through it.
"""

from __future__ import annotations

import contextlib
import time

import pytest
import urllib3
from urllib3.exceptions import NewConnectionError, ProtocolError, ReadTimeoutError

from tests.servers.faultproxy import Fault, FaultProxy, every_fault

BODY = bytes(range(256)) * 4096  # 1 MiB


@pytest.fixture
def own_proxies():
    """Proxies for these specs alone (their faults hit urllib3, not the initializer, so they
    stay out of the reliability figures)."""
    started: list[FaultProxy] = []

    def start(upstream: str, **options: object) -> FaultProxy:
        started.append(FaultProxy(upstream, **options).start())  # type: ignore[arg-type]
        return started[-1]

    yield start
    for proxy in started:
        proxy.stop()


@pytest.fixture
def through(bucket, s3_endpoint, own_proxies):
    """(proxy, url of a public 1 MiB object through it, a client with a 1 s read timeout)."""
    bucket.put("o/body.bin", BODY, ACL="public-read")
    proxy: FaultProxy = own_proxies(s3_endpoint)
    client = urllib3.PoolManager(retries=False, timeout=urllib3.Timeout(connect=2, read=1))
    return proxy, f"{proxy.url}/{bucket.name}/o/body.bin", client


def test_without_faults_the_answer_passes_through_unchanged(through):
    proxy, url, client = through
    response = client.request("GET", url, headers={"Range": "bytes=10-19"})
    assert response.status == 206 and response.data == BODY[10:20]
    assert proxy.total_injected == 0 and proxy.body_bytes == 10


@pytest.mark.parametrize(("status", "code"), [(500, "InternalError"), (503, "ServiceUnavailable")])
def test_error_faults_answer_an_s3_style_error(through, status, code):
    proxy, url, client = through
    proxy.force(Fault.error(status))
    response = client.request("GET", url)
    assert response.status == status and f"<Code>{code}</Code>" in response.data.decode()
    assert client.request("GET", url).data == BODY  # the connection and the next request are fine


def test_slowdown_is_s3_throttling(through):
    proxy, url, client = through
    proxy.force(Fault.slowdown())
    response = client.request("GET", url)
    assert response.status == 503 and "<Code>SlowDown</Code>" in response.data.decode()


def test_reset_sends_part_of_the_body_then_a_tcp_reset(through):
    proxy, url, client = through
    proxy.force(Fault.reset(after_bytes=1000))
    with pytest.raises(ProtocolError, match="reset by peer"):
        client.request("GET", url)


def test_short_sends_fewer_bytes_than_content_length_then_closes(through):
    proxy, url, client = through
    proxy.force(Fault.short(after_bytes=1000))
    with pytest.raises(ProtocolError, match=r"IncompleteRead\(1000 bytes read"):
        client.request("GET", url)


@pytest.mark.parametrize("after_bytes", [None, 100])
def test_stall_sends_nothing_more_until_the_client_times_out(through, after_bytes):
    proxy, url, client = through
    proxy.force(Fault.stall(30, after_bytes=after_bytes))
    started = time.monotonic()
    with pytest.raises((ReadTimeoutError, ProtocolError)) as failure:
        client.request("GET", url)
    assert "timed out" in str(failure.value).lower()
    assert 0.9 < time.monotonic() - started < 5


def test_outage_refuses_connections_for_its_duration_then_serves_again(through):
    proxy, url, client = through
    proxy.force(Fault.outage(1.0))
    started = time.monotonic()
    with pytest.raises(ProtocolError):
        client.request("GET", url)
    with pytest.raises(NewConnectionError):  # nobody listens on the port now
        urllib3.PoolManager(retries=False).connection_from_url(url)._new_conn().connect()
    while True:
        try:
            response = urllib3.PoolManager(retries=False).request("GET", url)
            break
        except urllib3.exceptions.HTTPError:
            assert time.monotonic() - started < 10
            time.sleep(0.05)
    assert response.data == BODY
    assert time.monotonic() - started >= 0.9


def test_random_faults_hit_the_same_requests_for_the_same_seed_and_take_kinds_in_turn(
    through, s3_endpoint, own_proxies
):
    _, url, _ = through
    path = url.split("/", 3)[3]
    kinds = every_fault(stall_seconds=0.05)[:-1]  # no outage: refused requests are not seen
    runs = []
    for _ in range(2):
        proxy = own_proxies(s3_endpoint, seed=3, share=0.5, faults=kinds, max_in_a_row=10**9)
        client = urllib3.PoolManager(retries=False, timeout=urllib3.Timeout(connect=2, read=1))
        for i in range(30):
            with contextlib.suppress(urllib3.exceptions.HTTPError):
                client.request("GET", f"{proxy.url}/{path}", headers={"Range": f"bytes={i}-"})
        runs.append(list(proxy.log))
    assert runs[0] == runs[1]
    assert len(kinds) <= len(runs[0]) < 25  # about half of the 30 requests
    assert [entry[0] for entry in runs[0][: len(kinds)]] == [fault.label for fault in kinds]

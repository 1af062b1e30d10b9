"""The native byte path stops, times out and resumes as urllib3's did: its small files on the
loop, its ranges on the workers' threads.

What the native path (pyreqwest) does differently: its reads wait in Rust, where no socket of
ours can be reached, so a stop ends the loop's waits, refuses new requests and shuts down the
process's client connections under the workers' blocking reads; a stall is caught between two
reads; small files are requested ahead of the workers; and its runtime must never cross a fork.
These specs drive the real CLI (and, for the cancel, the client itself) against the local Hub,
whose CDN stalls on demand.
"""

from __future__ import annotations

import os
import ssl
import threading
import time
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest

from initializers import interrupts, native, processes
from initializers.errors import AuthError, NotFoundError, TransientError, UsageError
from initializers.inflight import LOOP_PER_WORKER
from initializers.progress import human_bytes
from tests.reliability.conftest import (
    FIGURES,
    assert_identical,
    dataset,
    fill,
    s3_env,
    stop_with_sigterm,
)
from tests.servers.hub import Fault, fail_times
from tests.servers.tls import ca_signed, self_signed

MIB = 1 << 20


def hub_env(hub, out, **extra: str) -> dict[str, str]:
    return {
        "STORAGE_URI": "hf://org/m",
        "HF_ENDPOINT": hub.endpoint,
        "OUTPUT_PATH": str(out),
        **extra,
    }


def wait_for_cdn_get(hub, deadline_s: float = 30) -> None:
    deadline = time.monotonic() + deadline_s
    while not hub.find_requests(server="cdn", method="GET") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert hub.find_requests(server="cdn", method="GET"), "the fetch never reached the CDN"


@pytest.mark.parametrize(
    ("stalled", "size"),
    [("before the headers", 512 << 10), ("mid-body", 20 * MIB)],
    ids=["small-file-on-the-loop-before-headers", "large-file-on-a-worker-mid-body"],
)
def test_sigterm_while_the_cdn_stalls_exits_143_at_once_and_the_rerun_resumes(
    stalled, size, hub, launch, run_initializer, tmp_path
):
    weights = os.urandom(size)
    hub.add_repo("org/m", {"model.safetensors": weights, "config.json": b"{}"})
    stall = Fault.delay(600) if stalled == "before the headers" else Fault.truncate(12 * MIB, 600)
    hub.fault = fail_times(1, stall, server="cdn", method="GET")
    out = tmp_path / "out"
    env = hub_env(hub, out, TIMEOUT="120")  # a read would wait 120 s
    live = launch("model", env=env)
    wait_for_cdn_get(hub)
    time.sleep(1.5)  # the bytes before the stall are through; the read now waits in Rust
    stop_with_sigterm(live, out / "model.safetensors", within=5.0)

    rerun = run_initializer("model", env=env)
    assert rerun.code == 0, rerun.output
    assert (out / "model.safetensors").read_bytes() == weights
    if stalled == "mid-body":  # what came before the stall is kept
        assert f"resuming {human_bytes(12 * MIB)} already on disk" in rerun.stderr, rerun.stderr
    FIGURES["SIGTERMs survived"] += 1


@pytest.mark.parametrize(
    "stall",
    [Fault.delay(600), Fault.truncate(100_000, 600)],
    ids=["before-the-headers", "mid-body"],
)
def test_a_small_file_that_stalls_exits_7_after_the_retries_instead_of_hanging(
    stall, hub, launch, tmp_path
):
    hub.add_repo("org/m", {"model.safetensors": os.urandom(512 << 10)})
    hub.fault = fail_times(10**6, stall, server="cdn", method="GET")
    live = launch("model", env=hub_env(hub, tmp_path / "out", TIMEOUT="1", RETRIES="2"))
    code = live.finish(timeout=60)
    assert code == 7, live.stderr
    assert "stalled past the timeout" in live.stderr
    assert "still failing after 2 attempts" in live.stderr
    assert live.seconds < 30


def test_a_native_request_in_flight_is_cancelled_by_the_stop_and_a_later_one_refused(
    hub, stop_undone_afterwards
):
    sha = hub.add_repo("org/m", {"model.safetensors": os.urandom(512 << 10)})
    hub.fault = fail_times(10**6, Fault.delay(600), server="cdn", method="GET")
    path = f"org/m/resolve/{sha}/model.safetensors"
    client = native.NativeHttp(hub.endpoint, headers={}, timeout=120)  # a read would wait 120 s
    failures: list[BaseException] = []

    def fetch() -> None:
        try:
            client.open_range(path, 0, 512 << 10, "model.safetensors", whole=True)
        except BaseException as exc:
            failures.append(exc)

    worker = threading.Thread(target=fetch)
    worker.start()
    wait_for_cdn_get(hub)
    started = time.monotonic()
    interrupts.interrupt_reads()  # what the SIGTERM handler does
    worker.join(10)
    assert not worker.is_alive()
    assert time.monotonic() - started < 2.0
    assert len(failures) == 1 and isinstance(failures[0], TransientError), failures
    assert "stopped" in str(failures[0])

    started = time.monotonic()
    with pytest.raises(TransientError, match="stopped"):
        client.open_range(path, 0, 512 << 10, "model.safetensors", whole=True)
    assert time.monotonic() - started < 1.0


def test_small_files_keep_several_times_the_workers_requests_in_flight_on_the_hub(
    hub, run_initializer, tmp_path
):
    # Requests in flight are what a store 20 ms away needs, and two workers must not mean two
    # (the native loop keeps LOOP_PER_WORKER per worker, four times as many for tiny files):
    # every resolve here waits 1 s, so all those that arrive within 0.9 s of the first are open
    # at the same time.
    files = {f"data/{i:02d}.jsonl": os.urandom(1000 + i) for i in range(48)}
    hub.add_repo("org/m", files, repo_type="dataset")
    arrivals: list[float] = []
    lock = threading.Lock()

    def slow_resolves(request):
        if "/resolve/" not in request.path:
            return None
        with lock:
            arrivals.append(time.monotonic())
        return Fault.delay(1.0)

    hub.fault = slow_resolves
    out = tmp_path / "out"
    env = {**hub_env(hub, out, WORKERS="2"), "STORAGE_URI": "hf://datasets/org/m"}
    result = run_initializer("dataset", env=env)
    assert result.code == 0, result.output
    assert {name: (out / name).read_bytes() for name in files} == files
    open_together = sum(1 for t in arrivals if t - arrivals[0] < 0.9)
    assert open_together == 4 * 2 * LOOP_PER_WORKER, (
        open_together,
        [round(t - arrivals[0], 2) for t in arrivals],
    )


@pytest.mark.parametrize(
    ("status", "error", "words"),
    [
        (404, NotFoundError, "not found (HTTP 404)"),
        (403, AuthError, "access denied (HTTP 403)"),
        (401, AuthError, "access denied (HTTP 401)"),
        (503, TransientError, "HTTP 503"),
        (429, TransientError, "HTTP 429"),
        (500, TransientError, "HTTP 500"),
    ],
)
def test_a_native_failure_is_typed_by_its_status_and_names_the_file_not_the_url(
    status, error, words, hub
):
    sha = hub.add_repo("org/m", {"model.safetensors": os.urandom(4096)})
    hub.fault = fail_times(1, Fault.error(status), server="cdn", method="GET")
    client = native.NativeHttp(hub.endpoint, headers={}, timeout=10)
    with pytest.raises(error) as failure:
        client.open_range(f"org/m/resolve/{sha}/model.safetensors", 0, 4096, "weights", True)
    assert str(failure.value).startswith(f"weights: {words}"), failure.value
    assert "http://" not in str(failure.value)


def test_a_native_request_to_a_closed_port_is_a_transient_cannot_connect_with_its_reason():
    client = native.NativeHttp("http://127.0.0.1:9", headers={}, timeout=5)  # discard: closed
    with pytest.raises(
        TransientError, match=r"^weights: cannot connect to the server \(Connection refused\)$"
    ):
        client.open_range("org/m/resolve/x/model.safetensors", 0, 10, "weights", True)


def test_a_process_whose_native_client_runs_forks_no_workers(monkeypatch):
    # A runtime's threads do not survive a fork: a child would fail its first native request.
    monkeypatch.setattr(processes, "_fork_forbidden", False)
    monkeypatch.setattr(processes, "usable_cpus", lambda: 4)
    assert processes.process_count(2000, 16) == 4
    client = native.NativeHttp("http://127.0.0.1:9", headers={}, timeout=5)
    with pytest.raises(TransientError):
        client.open_range("x", 0, 10, "weights", True)
    assert processes.process_count(2000, 16) == 1


def test_the_native_path_trusts_the_ca_bundle_it_is_given_and_steps_aside_when_refused_despite_it(
    tmp_path,
):
    # A Hub mirror behind a private CA serves its small files over this path: --ca-bundle must
    # reach it, as it reaches urllib3.
    ca, cert, key, www = (tmp_path / name for name in ("ca.pem", "cert.pem", "key.pem", "www"))
    ca_signed(ca, cert, key)
    www.mkdir()
    body = os.urandom(4096)
    (www / "f.bin").write_bytes(body)
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(SimpleHTTPRequestHandler, directory=www))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"https://127.0.0.1:{server.server_address[1]}"
    try:
        trusted = native.NativeHttp(base, headers={}, timeout=10, roots=native.read_roots(str(ca)))
        with trusted.open_range("f.bin", 0, len(body), "f.bin", True) as reader:
            assert b"".join(bytes(chunk) for chunk in reader.chunks()) == body
        untrusted = native.NativeHttp(base, headers={}, timeout=10)
        with pytest.raises(UsageError, match=r"^f\.bin: TLS verification failed; pass --ca-bundle"):
            untrusted.open_range("f.bin", 0, len(body), "f.bin", True)
        # Refused despite a bundle: OpenSSL may yet take it (the workers' way decides), and
        # the native path is not tried again in this run.
        other = tmp_path / "other-ca.pem"
        ca_signed(other, tmp_path / "other-cert.pem", tmp_path / "other-key.pem")
        roots = native.read_roots(str(other))
        refused = native.NativeHttp(base, headers={}, timeout=10, roots=roots)
        with pytest.raises(native.NativeRefused):
            refused.open_range("f.bin", 0, len(body), "f.bin", True)
        assert refused.refused
        with pytest.raises(native.NativeRefused):
            refused.open_range("f.bin", 0, len(body), "f.bin", True)
    finally:
        server.shutdown()


@pytest.mark.parametrize("source", ["s3", "hf"])
@pytest.mark.parametrize(
    ("bundle", "message"),
    [
        (None, "cannot read the CA bundle {path}: No such file or directory"),
        (b"not a certificate\n", "the CA bundle {path} holds no certificate OpenSSL can load"),
    ],
    ids=["missing", "no-certificate"],
)
def test_a_ca_bundle_that_is_missing_or_holds_no_certificate_exits_2_before_any_request(
    source, bundle, message, bucket, s3_endpoint, hub, run_initializer, tmp_path
):
    # Read once a run, for every client: the same one line whichever source and client, and
    # never a silent fall-back to the system's CAs.
    path = tmp_path / "ca.pem"
    if bundle is not None:
        path.write_bytes(bundle)
    out = tmp_path / "out"
    if source == "s3":
        fill(bucket, "d", {"a.bin": b"x" * 10})
        env = s3_env(bucket, s3_endpoint, "d", out)
    else:
        hub.add_repo("org/m", {"a.bin": b"x" * 10})
        env = hub_env(hub, out)
    result = run_initializer("dataset", "--ca-bundle", str(path), env=env)
    assert result.code == 2, result.output
    assert message.format(path=path) in result.stderr
    assert "Traceback" not in result.stderr
    assert not out.exists() or not any(out.iterdir())
    assert not hub.find_requests()


@pytest.mark.parametrize(
    ("certificate", "native_refuses"),
    [("its own CA", True), ("signed by a private CA", False)],
    ids=["self-signed", "private-ca"],
)
def test_s3_over_https_with_a_ca_bundle_fetches_every_small_file_whichever_tls_takes_it(
    certificate, native_refuses, bucket, s3_endpoint, proxies, launch, tmp_path
):
    # A MinIO's `openssl req -x509` certificate is its own CA: OpenSSL takes it from the bundle,
    # the native client's rustls does not ("CaUsedAsEndEntity"). Small files then go the urllib3
    # way for the rest of the run, each with no failed attempt counted; a certificate a CA of
    # the bundle signed stays on the native path.
    ca, cert, key = (tmp_path / name for name in ("ca.pem", "cert.pem", "key.pem"))
    if native_refuses:
        self_signed(cert, key)
        ca = cert
    else:
        ca_signed(ca, cert, key)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    files = dataset(44, {f"shards/{i:02d}.jsonl": 30_000 + i for i in range(12)})
    fill(bucket, "d", files)
    proxy = proxies(s3_endpoint, tls=context)
    out = tmp_path / "out"
    env = s3_env(bucket, proxy.url, "d", out, AWS_CA_BUNDLE=str(ca), WORKERS="2")
    run = launch("dataset", env=env)
    assert run.finish() == 0, run.stderr
    assert_identical(out, files)
    warned = run.stderr.count("refused the endpoint's TLS certificate")
    assert (warned, proxy.handshakes_refused > 0) == ((1, True) if native_refuses else (0, False))


def test_s3_over_https_without_a_ca_bundle_for_a_self_signed_certificate_exits_2_naming_the_fix(
    bucket, s3_endpoint, proxies, launch, tmp_path
):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    self_signed(cert, key)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    fill(bucket, "d", dataset(45, {"a.jsonl": 1000}))
    proxy = proxies(s3_endpoint, tls=context)
    out = tmp_path / "out"
    run = launch("dataset", env=s3_env(bucket, proxy.url, "d", out))
    assert run.finish() == 2
    assert "pass --ca-bundle" in run.stderr and "Traceback" not in run.stderr
    assert not (out / "a.jsonl").exists()


def test_a_hub_mirror_behind_a_private_ca_is_listed_as_well_as_fetched_with_the_ca_bundle(
    hub, proxies, run_initializer, tmp_path
):
    # --ca-bundle reached the file GETs but not huggingface_hub's own client, which resolves the
    # revision and lists the tree: such a mirror failed before its first file.
    ca, cert, key = (tmp_path / name for name in ("ca.pem", "cert.pem", "key.pem"))
    ca_signed(ca, cert, key)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    files = dataset(46, {"config.json": 900, "model.safetensors": 3 << 20})
    hub.add_repo("org/m", files)
    api = proxies(hub.endpoint, tls=context)
    assert api.url.startswith("https://")
    out = tmp_path / "out"
    env = {"STORAGE_URI": "hf://org/m", "HF_ENDPOINT": api.url, "OUTPUT_PATH": str(out)}
    result = run_initializer("model", "--ca-bundle", str(ca), env=env)
    assert result.code == 0, result.output
    assert_identical(out, files)
    without = run_initializer("model", env=env | {"OUTPUT_PATH": str(tmp_path / "other")})
    assert without.code == 2 and "pass --ca-bundle" in without.stderr, without.output
    assert "Traceback" not in without.stderr

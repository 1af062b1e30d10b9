"""gs:// under a bad network and kills, against fake-gcs-server behind the fault proxy."""

from __future__ import annotations

from initializers.manifest import find_problems
from tests.reliability.conftest import assert_identical, dataset, kill_before_rename_then_resume
from tests.servers.faultproxy import every_fault
from tests.test_gcs_source import MIB, fill, gcs_env


def test_random_faults_between_the_initializer_and_gcs_leave_a_byte_identical_tree(
    gcs_emulator, gcs_bucket, proxies, run_initializer, tmp_path
):
    files = dataset(42, {"big.bin": 72 * MIB, **{f"s/{i}.json": 3_000 + i for i in range(12)}})
    fill(gcs_emulator, gcs_bucket, "d", files)
    proxy = proxies(gcs_emulator.url, seed=43, share=0.3, faults=every_fault(stall_seconds=30))
    out = tmp_path / "out"
    env = {"STORAGE_URI": f"gs://{gcs_bucket}/d", "OUTPUT_PATH": str(out)}
    env |= {"STORAGE_EMULATOR_HOST": proxy.url, "TIMEOUT": "1"}
    result = run_initializer("dataset", env=env)
    assert result.code == 0, result.output
    assert_identical(out, files)
    assert find_problems(out) == []
    assert proxy.total_injected > 0


def test_a_kill_before_the_large_files_rename_is_resumed_not_refetched(
    gcs_emulator, gcs_bucket, launch, run_initializer, tmp_path
):
    files = dataset(44, {"big.bin": 64 * MIB, "config.json": 100})
    fill(gcs_emulator, gcs_bucket, "d", files)
    out = tmp_path / "out"
    env = gcs_env(gcs_emulator, f"gs://{gcs_bucket}/d", out)
    kill_before_rename_then_resume(
        launch, run_initializer, "dataset", (), env, out, files, "big.bin"
    )


def test_an_object_replaced_after_the_listing_is_not_mixed_with_the_generation_listed(
    gcs_emulator, gcs_bucket, proxies, launch, tmp_path
):
    # The download waits at the proxy while the object is overwritten (a new generation): the
    # request pinned to the listed generation must fail, never deliver the new bytes.
    fill(gcs_emulator, gcs_bucket, "d", {"a.bin": b"old" * 1000})
    proxy = proxies(gcs_emulator.url)
    proxy.hold(lambda request: request.path.startswith("/download/"))
    out = tmp_path / "out"
    env = gcs_env(gcs_emulator, f"gs://{gcs_bucket}/d", out, STORAGE_EMULATOR_HOST=proxy.url)
    live = launch("dataset", env=env)
    proxy.wait_parked()
    gcs_emulator.put(gcs_bucket, "d/a.bin", b"new" * 1000)
    proxy.release()
    assert live.finish(timeout=60) == 4, live.stderr
    assert "since it was listed" in live.stderr
    assert not (out / "a.bin").exists()

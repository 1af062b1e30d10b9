"""az:// under a bad network and kills, against Azurite behind the fault proxy."""

from __future__ import annotations

from initializers.manifest import find_problems
from initializers.sources.azure import DEV_ACCOUNT
from tests.reliability.conftest import assert_identical, dataset, kill_before_rename_then_resume
from tests.servers.faultproxy import every_fault
from tests.test_azure_source import MIB, env_for, fill


def test_random_faults_between_the_initializer_and_azure_leave_a_byte_identical_tree(
    azurite, container_name, proxies, run_initializer, tmp_path
):
    files = dataset(52, {"big.bin": 72 * MIB, **{f"s/{i}.json": 4_000 + i for i in range(12)}})
    fill(azurite, container_name, "d", files)
    upstream = azurite.endpoint.removesuffix(f"/{DEV_ACCOUNT}")
    proxy = proxies(upstream, seed=53, share=0.3, faults=every_fault(stall_seconds=30))
    out = tmp_path / "out"
    connection = azurite.connection_string(endpoint=f"{proxy.url}/{DEV_ACCOUNT}")
    env = env_for(
        f"az://{container_name}/d", out, AZURE_STORAGE_CONNECTION_STRING=connection, TIMEOUT="1"
    )
    result = run_initializer("dataset", env=env)
    assert result.code == 0, result.output
    assert_identical(out, files)
    assert find_problems(out) == []
    assert proxy.total_injected > 0


def test_a_kill_before_the_large_blobs_rename_is_resumed_not_refetched(
    azurite, container_name, launch, run_initializer, tmp_path
):
    files = dataset(54, {"big.bin": 64 * MIB, "config.json": 100})
    fill(azurite, container_name, "d", files)
    out = tmp_path / "out"
    env = env_for(
        f"az://{container_name}/d", out, AZURE_STORAGE_CONNECTION_STRING=azurite.connection_string()
    )
    kill_before_rename_then_resume(
        launch, run_initializer, "dataset", (), env, out, files, "big.bin"
    )

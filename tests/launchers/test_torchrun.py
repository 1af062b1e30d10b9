"""kf-torchrun: the Kubeflow torch contract (PET_* env) turned into a correct torchrun launch.

Real torchrun processes (2 "nodes" x 2 processes on loopback, gloo), and the checks the shim
makes before it starts torchrun (which it looks up first, so these need torch installed too).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.launchers.conftest import (
    SCRIPTS,
    clean_env,
    console_script,
    free_port,
    write_complete_asset,
)

ALLREDUCE = str(SCRIPTS / "torch_allreduce.py")

pytestmark = pytest.mark.launchers


def pet_env(nnodes: int, nproc: int | str, rank: int, port: int) -> dict[str, str]:
    """PET_* exactly as Kubeflow Trainer's torch plugin sets them (master by DNS name)."""
    return {
        "PET_NNODES": str(nnodes),
        "PET_NPROC_PER_NODE": str(nproc),
        "PET_NODE_RANK": str(rank),
        "PET_MASTER_ADDR": "localhost",
        "PET_MASTER_PORT": str(port),
    }


def start_node(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [console_script("kf-torchrun"), *args],
        env=clean_env(**env),
        stdin=subprocess.DEVNULL,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )


def results(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(out.glob("rank-*.json"))]


def test_two_nodes_of_two_processes_allreduce_and_read_the_initialized_model(tmp_path):
    model = write_complete_asset(tmp_path / "model", {"config.json": b'{"layers": 2}'})
    out = tmp_path / "out"
    out.mkdir()
    port = free_port()
    args = ["--require", str(model), ALLREDUCE, str(out), str(model / "config.json")]
    # The worker node starts first, as pods often do: it must wait for the master.
    worker = start_node(args, pet_env(2, 2, 1, port), tmp_path / "node1.log")
    time.sleep(1.0)
    master = start_node(args, pet_env(2, 2, 0, port), tmp_path / "node0.log")
    assert master.wait(timeout=180) == 0, (tmp_path / "node0.log").read_text()
    assert worker.wait(timeout=60) == 0, (tmp_path / "node1.log").read_text()

    ranks = results(out)
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3]
    assert {r["world_size"] for r in ranks} == {4}
    assert {r["sum"] for r in ranks} == {1.0 + 2 + 3 + 4}
    assert {r["model"] for r in ranks} == {'{"layers": 2}'}
    worker_log = (tmp_path / "node1.log").read_text()
    assert "waiting up to 600s for the torch master" in worker_log
    assert "world size      4 (global ranks 2-3 here)" in worker_log
    assert f"--node-rank=1 --master-addr=localhost --master-port={port}" in worker_log


def test_ranks_read_a_model_that_the_real_model_initializer_fetched_from_s3(
    tmp_path, shim, bucket, run_initializer
):
    bucket.put("models/tiny/config.json", b'{"hidden": 8}')
    bucket.put("models/tiny/model.safetensors", b"\x00" * 4096)
    model = tmp_path / "workspace" / "model"
    fetched = run_initializer("model", env=bucket.env("models/tiny", OUTPUT_PATH=str(model)))
    assert fetched.code == 0, fetched.output
    out = tmp_path / "out"
    out.mkdir()
    ran = shim(
        "kf-torchrun",
        "--require",
        str(model),
        ALLREDUCE,
        str(out),
        str(model / "config.json"),
        env={"PET_NPROC_PER_NODE": "2"},
    )
    assert ran.code == 0, ran.stderr
    assert [(r["sum"], r["model"]) for r in results(out)] == [(3.0, '{"hidden": 8}')] * 2
    assert f"asset           {model}: 2 files, 4.0 KiB, from s3://{bucket.name}/models/tiny" in (
        ran.stderr
    )


def test_single_node_without_any_pet_env_runs_standalone_and_passes_arguments_untouched(
    tmp_path, shim
):
    out = tmp_path / "out"
    out.mkdir()
    user_args = ["--lr", "0.1", "--name", "two words", "--", "--weird=x", "-m"]
    ran = shim("kf-torchrun", ALLREDUCE, str(out), "-", *user_args)
    assert ran.code == 0, ran.stderr
    ranks = results(out)
    cpus = len(os.sched_getaffinity(0))  # no CPU quota on the test machine
    assert [r["rank"] for r in ranks] == list(range(cpus))
    assert {r["world_size"] for r in ranks} == {cpus}
    assert all(r["args"] == user_args for r in ranks)
    assert "--standalone" in ran.stderr
    assert f"procs per node  {cpus} (PET_NPROC_PER_NODE=auto: no GPU visible" in ran.stderr


def test_node_started_before_the_model_is_complete_waits_then_proceeds(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / ".weights.safetensors.part").write_bytes(b"half")  # initializer still running
    out = tmp_path / "out"
    out.mkdir()
    log = tmp_path / "node.log"
    node = start_node(
        ["--require", str(model), ALLREDUCE, str(out), str(model / "weights.safetensors")],
        {"PET_NPROC_PER_NODE": "1"},
        log,
    )
    deadline = time.monotonic() + 30
    while "waiting up to" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "waiting up to 600s for assets" in log.read_text()
    time.sleep(1.0)
    assert node.poll() is None, "the node must keep waiting while the manifest is absent"
    assert not list(out.iterdir()), "training must not start before the model is complete"

    (model / ".weights.safetensors.part").unlink()
    write_complete_asset(model, {"weights.safetensors": b"complete weights"})
    assert node.wait(timeout=120) == 0, log.read_text()
    assert [r["model"] for r in results(out)] == ["complete weights"]
    assert "ready after" in log.read_text()


def test_shim_becomes_torchrun_so_sigterm_reaches_the_training_processes(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    log = tmp_path / "node.log"
    node = start_node(
        [str(SCRIPTS / "wait_for_sigterm.py"), str(out)], {"PET_NPROC_PER_NODE": "1"}, log
    )
    deadline = time.monotonic() + 60
    while not (out / "started").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert (out / "started").exists(), log.read_text()
    cmdline = Path(f"/proc/{node.pid}/cmdline").read_bytes().split(b"\0")
    assert any(part.endswith(b"torchrun") for part in cmdline[:2]), cmdline  # exec, not a child

    node.send_signal(signal.SIGTERM)
    code = node.wait(timeout=60)
    assert (out / "got-sigterm").read_text() == "yes"
    assert code != 0


def test_training_failure_exit_code_is_torchrun_own(tmp_path, shim):
    script = tmp_path / "fail.py"
    script.write_text("import sys\nsys.exit(3)\n")
    direct = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node=1",
            str(script),
        ],
        env=clean_env(),
        capture_output=True,
        timeout=120,
    )
    ran = shim("kf-torchrun", str(script), env={"PET_NPROC_PER_NODE": "1"})
    assert direct.returncode != 0
    assert ran.code == direct.returncode


# --- checks before torchrun starts (still need a torch install: it is looked up first) -------


def test_missing_model_times_out_with_exit_4_and_one_clear_line(tmp_path, shim):
    model = tmp_path / "model"
    model.mkdir()
    ran = shim("kf-torchrun", "--require", str(model), "--wait-timeout", "1", "train.py")
    assert ran.code == 4
    assert len(ran.error_lines) == 1
    line = ran.error_lines[0]
    assert line.startswith("kf-torchrun: error: required assets not complete after 1s: ")
    assert str(model / ".initializer-manifest.json") in line
    assert "--wait-timeout" in line
    assert "Traceback" not in ran.stderr
    assert "exec " not in ran.stderr  # torchrun never started
    assert ran.seconds < 15


def test_required_assets_can_come_from_env_and_each_one_must_be_complete(tmp_path, shim):
    model = write_complete_asset(tmp_path / "model", {"a.json": b"{}"})
    dataset = tmp_path / "dataset"
    dataset.mkdir()
    ran = shim(
        "kf-torchrun",
        "train.py",
        env={"KF_REQUIRE_ASSETS": f"{model},{dataset}", "KF_WAIT_TIMEOUT": "0"},
    )
    assert ran.code == 4
    assert str(dataset) in ran.error_lines[0]
    assert str(model) not in ran.error_lines[0]


def test_an_asset_edited_after_the_initializer_finished_is_not_complete(tmp_path, shim):
    model = write_complete_asset(tmp_path / "model", {"w.bin": b"12345678"})
    (model / "w.bin").write_bytes(b"1234")  # truncated after the manifest was written
    ran = shim("kf-torchrun", "--require", str(model), "--wait-timeout", "0", "train.py")
    assert ran.code == 4
    assert f"{model / 'w.bin'} changed or missing" in ran.error_lines[0]


def test_non_zero_rank_gives_up_on_an_unreachable_master_with_exit_7(shim):
    port = free_port()  # nothing listens there
    env = pet_env(2, 1, 1, port) | {"PET_MASTER_ADDR": "127.0.0.1"}
    ran = shim("kf-torchrun", "--peer-timeout", "2", "train.py", env=env)
    assert ran.code == 7
    assert f"master 127.0.0.1:{port} not accepting connections" in ran.error_lines[0]
    assert "raise --peer-timeout (KF_PEER_TIMEOUT)" in ran.error_lines[0]
    assert 2 <= ran.seconds < 15


def test_a_master_name_that_does_not_resolve_is_reported_as_such(shim):
    env = pet_env(2, 1, 1, 29500) | {"PET_MASTER_ADDR": "job-node-0-0.no-such-job.invalid"}
    ran = shim("kf-torchrun", "train.py", env=env | {"KF_PEER_TIMEOUT": "0"})
    assert ran.code == 7
    assert "master job-node-0-0.no-such-job.invalid:29500 does not resolve" in ran.error_lines[0]


def test_dry_run_prints_topology_and_the_torchrun_command_without_launching(shim):
    env = pet_env(3, 4, 2, 29500) | {"PET_MASTER_ADDR": "job-node-0-0.job"}
    ran = shim("kf-torchrun", "--dry-run", "train.py", "--epochs", "1", env=env)
    assert ran.code == 0, ran.stderr
    assert "nodes           3 (this is node 2)" in ran.stderr
    assert "world size      12 (global ranks 8-11 here)" in ran.stderr
    assert (
        "--nnodes=3 --nproc-per-node=4 --node-rank=2 --master-addr=job-node-0-0.job "
        "--master-port=29500 train.py --epochs 1"
    ) in ran.stderr


def test_nproc_auto_counts_visible_gpus_before_cpus(shim):
    ran = shim("kf-torchrun", "--dry-run", "train.py", env={"CUDA_VISIBLE_DEVICES": "0,1,2"})
    assert "procs per node  3 (PET_NPROC_PER_NODE=auto: 3 GPU(s) visible)" in ran.stderr

"""file:// under kills: a copy killed at its last step is resumed, not copied again."""

from __future__ import annotations

from tests.reliability.conftest import FIGURES, assert_identical, dataset

MIB = 1 << 20


def test_a_kill_before_the_large_files_rename_is_resumed_not_copied_again(
    launch, run_initializer, tmp_path
):
    files = dataset(61, {"model.safetensors": 64 * MIB, "config.json": 120})
    source = tmp_path / "pvc"
    source.mkdir()
    for name, body in files.items():
        (source / name).write_bytes(body)
    out = tmp_path / "model"
    args = ("--storage-uri", f"file://{source}", "--output", str(out))
    live = launch("model", *args, env={}, kill_at=("os.rename", "model.safetensors", 1, "before"))
    assert live.finish(timeout=60) == -9, live.stderr
    rerun = run_initializer("model", *args)
    assert rerun.code == 0, rerun.output
    assert "resuming 64.00 MiB already on disk" in rerun.stderr, rerun.stderr
    assert_identical(out, files)
    FIGURES["SIGKILLs survived (other schemes)"] += 1

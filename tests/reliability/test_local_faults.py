"""file:// under kills: a copy killed at its last step is resumed, not copied again."""

from __future__ import annotations

from tests.reliability.conftest import dataset, kill_before_rename_then_resume

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
    kill_before_rename_then_resume(
        launch, run_initializer, "model", args, {}, out, files, "model.safetensors"
    )

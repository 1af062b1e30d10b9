"""file:// — a mounted folder or file, copied with the engine's checks, resume and manifest."""

from __future__ import annotations

import errno
import os
import random
from pathlib import Path

import pytest

from initializers.errors import IntegrityError
from initializers.manifest import find_problems, read_manifest
from initializers.sources.local import LocalSource
from tests.conftest import tree

MIB = 1 << 20


def make_folder(root: Path, files: dict[str, bytes]) -> dict[str, bytes]:
    for name, body in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(body)
    return files


@pytest.fixture
def source_folder(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    rng = random.Random(3)
    root = tmp_path / "pvc" / "llama"
    files = make_folder(
        root,
        {
            "config.json": b'{"model_type": "llama"}',
            "model-00001.safetensors": rng.randbytes(40 * MIB),  # fetched in two ranges
            "tokenizer/tokenizer.json": rng.randbytes(300_000),
        },
    )
    return root, files


def test_a_folder_is_copied_byte_identical_with_a_manifest_and_a_rerun_copies_nothing(
    source_folder, run_initializer, tmp_path
):
    root, files = source_folder
    out = tmp_path / "model"
    first = run_initializer("model", "--storage-uri", f"file://{root}", "--output", str(out))
    assert first.code == 0, first.output
    assert tree(out) == files
    assert find_problems(out) == []
    assert read_manifest(out).source == f"file://{root}"

    again = run_initializer("model", env={"STORAGE_URI": f"file://{root}", "OUTPUT_PATH": str(out)})
    assert again.code == 0, again.output
    assert "already complete" in again.stderr, again.stderr


def test_a_file_changed_since_the_last_run_is_copied_again_and_only_that_one(
    source_folder, run_initializer, tmp_path
):
    root, _ = source_folder
    out = tmp_path / "model"
    assert (
        run_initializer("model", "--storage-uri", f"file://{root}", "--output", str(out)).code == 0
    )
    (root / "config.json").write_bytes(b'{"model_type": "mistral"}')
    rerun = run_initializer("model", "--storage-uri", f"file://{root}", "--output", str(out))
    assert rerun.code == 0, rerun.output
    assert "fetching 1 of 3 files" in rerun.stderr, rerun.stderr
    assert (out / "config.json").read_bytes() == b'{"model_type": "mistral"}'


def test_one_file_is_copied_under_its_own_name(source_folder, run_initializer, tmp_path):
    root, files = source_folder
    out = tmp_path / "model"
    uri = f"file://{root}/model-00001.safetensors"
    result = run_initializer("model", "--storage-uri", uri, "--output", str(out))
    assert result.code == 0, result.output
    assert tree(out) == {"model-00001.safetensors": files["model-00001.safetensors"]}


def test_file_symlinks_are_followed_folder_symlinks_and_bookkeeping_are_not_copied(
    tmp_path, run_initializer
):
    # A Hugging Face cache snapshot is a folder of symlinks into blobs/; a folder an earlier
    # run filled holds our manifest and lock, which must not be copied as data.
    cache = tmp_path / "hub" / "models--org--m"
    make_folder(cache / "blobs", {"abc": b"weights", "def": b"{}"})
    snapshot = cache / "snapshots" / "0123"
    snapshot.mkdir(parents=True)
    (snapshot / "model.safetensors").symlink_to("../../blobs/abc")
    (snapshot / "config.json").symlink_to("../../blobs/def")
    (snapshot / "loop").symlink_to(".", target_is_directory=True)
    (snapshot / ".initializer-manifest.json").write_text("{}")
    (snapshot / ".initializer.lock").write_text("")
    out = tmp_path / "model"
    result = run_initializer("model", "--storage-uri", f"file://{snapshot}", "--output", str(out))
    assert result.code == 0, result.output
    assert tree(out) == {"model.safetensors": b"weights", "config.json": b"{}"}
    assert "skipped 'loop'" in result.stderr and "symlink to a folder" in result.stderr
    assert not (out / "model.safetensors").is_symlink()


@pytest.mark.parametrize(
    ("uri", "code", "words"),
    [
        ("file://relative/path", 2, "must be absolute"),
        ("file:///nonexistent/models/llama", 4, "does not exist"),
    ],
)
def test_bad_local_paths_exit_with_a_clear_error(uri, code, words, run_initializer, tmp_path):
    result = run_initializer("model", "--storage-uri", uri, "--output", str(tmp_path / "out"))
    assert result.code == code, result.output
    assert words in result.stderr
    assert "Traceback" not in result.output


def test_an_empty_folder_exits_4(tmp_path, run_initializer):
    (tmp_path / "empty").mkdir()
    uri = f"file://{tmp_path / 'empty'}"
    result = run_initializer("model", "--storage-uri", uri, "--output", str(tmp_path / "out"))
    assert result.code == 4, result.output
    assert "empty folder" in result.stderr


def test_a_file_written_to_while_it_is_copied_fails_instead_of_landing_mixed(tmp_path):
    path = tmp_path / "src" / "shard.bin"
    make_folder(path.parent, {"shard.bin": b"x" * (3 * MIB)})
    source = LocalSource(path.parent)
    (listed,) = source.list().files
    with source.open_range(listed, 0, listed.size) as reader:
        chunks = reader.chunks()
        next(chunks)
        with path.open("r+b") as writer:  # another writer changes it under the copy
            writer.write(b"y")
        os.utime(path, ns=(0, 12345))
        with pytest.raises(IntegrityError, match="changed in the source folder"):
            list(chunks)


@pytest.mark.parametrize("kernel_copy", [True, False], ids=["copy_file_range", "refused"])
def test_the_kernel_copies_the_bytes_and_pread_pwrite_take_over_where_it_refuses(
    kernel_copy, tmp_path, monkeypatch
):
    body = random.Random(8).randbytes(9 * MIB + 123)
    make_folder(tmp_path / "src", {"w.bin": body})
    if not kernel_copy:  # a filesystem pair the kernel cannot copy between (EXDEV)

        def refuse(*args: object) -> int:
            raise OSError(errno.EXDEV, "Invalid cross-device link")

        monkeypatch.setattr(os, "copy_file_range", refuse)
    source = LocalSource(tmp_path / "src")
    (listed,) = source.list().files
    target = os.open(tmp_path / "copy.bin", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        with source.open_range(listed, MIB, listed.size) as reader:
            steps = list(reader.copy_into(target, MIB))
        assert sum(steps) == listed.size - MIB and max(steps) <= 4 * MIB
        assert os.pread(target, listed.size, MIB) == body[MIB:]
    finally:
        os.close(target)

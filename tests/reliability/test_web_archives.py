"""http(s):// and archives under attack: hostile members, a zip bomb, damage, kills, a bad network.

A hostile archive must not write outside the destination, create a link or a device, or fill
the volume; a damaged one must fail with exit 5 and leave no member under its final name; a
kill at any point must leave a folder the next run completes; random network faults between
the initializer and the server must leave a byte-identical tree.
"""

from __future__ import annotations

import io
import random
import stat
import tarfile
import zipfile
from pathlib import Path

import pytest

from initializers.manifest import find_problems
from tests.conftest import tree
from tests.reliability.conftest import FIGURES, assert_identical, dataset
from tests.servers.faultproxy import every_fault

MIB = 1 << 20


def hostile_tar() -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:

        def add(name: str, body: bytes = b"", **fields: object) -> None:
            info = tarfile.TarInfo(name)
            info.size = len(body)
            for key, value in fields.items():
                setattr(info, key, value)
            archive.addfile(info, io.BytesIO(body) if body else None)

        add("ok/good.txt", b"good")
        add("../evil.txt", b"evil")
        add("/tmp/abs-evil.txt", b"evil")
        add("ok/../../evil2.txt", b"evil")
        add("ok/passwd", type=tarfile.SYMTYPE, linkname="/etc/passwd")
        add("ok/up", type=tarfile.SYMTYPE, linkname="../../outside.txt")
        add("ok/hard-out", type=tarfile.LNKTYPE, linkname="../evil.txt")
        add("ok/tty", type=tarfile.CHRTYPE, devmajor=5, devminor=0)
        add("ok/pipe", type=tarfile.FIFOTYPE)
        add("ok/alias.txt", type=tarfile.SYMTYPE, linkname="good.txt")  # inside: a copy
        add("ok/copy.txt", type=tarfile.LNKTYPE, linkname="ok/good.txt")  # inside: a copy
        add(".initializer-manifest.json", b"{}")  # our own bookkeeping name
    return buffer.getvalue()


def hostile_zip() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("ok/good.txt", b"good")
        archive.writestr("../evil.txt", b"evil")
        archive.writestr("/abs-evil.txt", b"evil")
        archive.writestr("ok\\..\\..\\evil.txt", b"evil")
        link = zipfile.ZipInfo("ok/passwd")
        link.external_attr = (stat.S_IFLNK | 0o777) << 16
        archive.writestr(link, "/etc/passwd")
        inside = zipfile.ZipInfo("ok/alias.txt")
        inside.external_attr = (stat.S_IFLNK | 0o777) << 16
        archive.writestr(inside, "good.txt")
    return buffer.getvalue()


def nothing_outside(root: Path, out: Path) -> None:
    strays = [p for p in root.rglob("*evil*") if out not in p.parents]
    assert strays == [] and not Path("/tmp/abs-evil.txt").exists()
    assert not any(p.is_symlink() for p in out.rglob("*"))


def test_a_hostile_tar_writes_only_its_safe_members_and_links_inside_as_copies(
    web, run_initializer, tmp_path
):
    out = tmp_path / "deep" / "model"
    url = web.put("/x/model.tar.gz", hostile_tar())
    result = run_initializer("model", "--storage-uri", url, "--output", str(out))
    assert result.code == 0, result.output
    assert tree(out) == {"ok/good.txt": b"good", "ok/alias.txt": b"good", "ok/copy.txt": b"good"}
    nothing_outside(tmp_path, out)
    for name in ("../evil.txt", "ok/passwd", "ok/up", "ok/hard-out", "ok/tty", "ok/pipe"):
        assert f"skipped {name!r}" in result.stderr, name
    assert find_problems(out) == []
    FIGURES["hostile archive members refused"] += 8


def test_a_hostile_zip_writes_only_its_safe_members(web, run_initializer, tmp_path):
    out = tmp_path / "deep" / "model"
    url = web.put("/x/model.zip", hostile_zip())
    result = run_initializer("model", "--storage-uri", url, "--output", str(out))
    assert result.code == 0, result.output
    assert tree(out) == {"ok/good.txt": b"good", "ok/alias.txt": b"good"}
    nothing_outside(tmp_path, out)
    assert "skipped 'ok/passwd'" in result.stderr
    FIGURES["hostile archive members refused"] += 4


def test_a_zip_bomb_stops_with_exit_6_before_writing_a_member(
    web, run_initializer, tmpfs, tmp_path
):
    volume = tmpfs("small", 24)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("config.json", b"{}")
        archive.writestr("weights.bin", bytes(64 * MIB))  # 64 MiB of zeros, ~64 KiB packed
    url = web.put("/x/model.zip", buffer.getvalue())
    out = volume / "model"
    result = run_initializer("model", "--storage-uri", url, "--output", str(out))
    assert result.code == 6, result.output
    assert "unpacks to 64.00 MiB" in result.stderr and "free" in result.stderr
    assert tree(out) == {}
    assert "Traceback" not in result.output


def _zip_with_a_flipped_byte() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("model.safetensors", bytes(range(256)) * 4096)
    damaged = bytearray(buffer.getvalue())
    damaged[1000] ^= 0xFF  # inside the stored data: its CRC-32 no longer matches
    return bytes(damaged)


def _tar_gz(body: bytes) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        info = tarfile.TarInfo("model.safetensors")
        info.size = len(body)
        archive.addfile(info, io.BytesIO(body))
    return buffer.getvalue()


def _tar_gz_with_a_flipped_byte() -> bytes:
    # Incompressible data is stored as is in the deflate stream, so the flip changes one byte of
    # the member and is caught by the gzip trailer's CRC-32, after the whole stream is read.
    damaged = bytearray(_tar_gz(random.Random(5).randbytes(MIB)))
    damaged[len(damaged) // 2] ^= 0xFF
    return bytes(damaged)


def _tar_gz_cut_short() -> bytes:
    whole = _tar_gz(random.Random(6).randbytes(MIB))
    return whole[: len(whole) * 2 // 3]


@pytest.mark.parametrize(
    "name, make",
    [
        ("model.zip", _zip_with_a_flipped_byte),
        ("model.tar.gz", _tar_gz_with_a_flipped_byte),
        ("model.tar.gz", _tar_gz_cut_short),
    ],
    ids=["zip-crc", "tar.gz-crc", "tar.gz-truncated"],
)
def test_a_damaged_archive_fails_with_exit_5_and_leaves_no_member_under_a_final_name(
    web, run_initializer, tmp_path, name, make
):
    url = web.put(f"/x/{name}", make())
    out = tmp_path / "model"
    result = run_initializer("model", "--storage-uri", url, "--output", str(out))
    assert result.code == 5, result.output
    assert "damaged" in result.stderr or "not a readable archive" in result.stderr
    assert "Traceback" not in result.output
    assert tree(out) == {}


def test_a_kill_at_any_rename_of_an_unpack_leaves_a_folder_the_next_run_completes(
    web, launch, run_initializer, tmp_path
):
    files = dataset(31, {f"shard-{i}.safetensors": 300_000 + i for i in range(6)})
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, body in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(body)
            archive.addfile(info, io.BytesIO(body))
    url = web.put("/x/model.tar.gz", buffer.getvalue())
    out = tmp_path / "model"
    points = [
        ("model.tar.gz", "before"),  # the archive's own commit in the staging folder
        ("shard-0.safetensors", "before"),
        ("shard-3.safetensors", "after"),
        (".initializer-manifest.json", "before"),
    ]
    for substring, when in points:
        live = launch(
            "model",
            "--storage-uri",
            url,
            "--output",
            str(out),
            env={},
            kill_at=("os.rename", substring, 1, when),
        )
        assert live.finish(timeout=60) == -9, live.stderr
        assert find_problems(out) != [] or not (out / ".initializer-manifest.json").exists()
        rerun = run_initializer("model", "--storage-uri", url, "--output", str(out))
        assert rerun.code == 0, rerun.output
        assert_identical(out, files)
        assert find_problems(out) == []
        (out / ".initializer-manifest.json").unlink()  # the next kill point starts over
        FIGURES["SIGKILLs survived (archive fetch and unpack)"] += 1


def test_a_killed_download_of_a_large_file_resumes_from_its_journal(
    web, proxies, launch, run_initializer, tmp_path
):
    files = dataset(32, {"model.safetensors": 96 * MIB})
    web.put("/x/model.safetensors", files["model.safetensors"])
    slow = proxies(web.url, rate=12 * MIB)  # per connection: the fetch takes a few seconds
    out = tmp_path / "model"
    url = slow.url + "/x/model.safetensors"
    live = launch("model", "--storage-uri", url, "--output", str(out), env={})
    live.wait_for("fetching 1 of 1 files")
    journal = out / ".model.safetensors.part.journal"
    deadline_bytes = 24 * MIB
    while slow.body_bytes < deadline_bytes:
        live.proc.poll()
        assert live.proc.returncode is None, live.stderr
        __import__("time").sleep(0.05)
    live.kill()
    assert journal.exists()
    sent_before = slow.body_bytes
    rerun = run_initializer(
        "model", "--storage-uri", web.url + "/x/model.safetensors", "--output", str(out)
    )
    assert rerun.code == 0, rerun.output
    assert "resuming" in rerun.stderr, rerun.stderr
    assert_identical(out, files)
    assert (
        web.body_bytes - sent_before < 96 * MIB - 8 * MIB
    )  # the kept bytes were not fetched again


def test_random_faults_between_the_initializer_and_a_web_server_leave_a_byte_identical_tree(
    web, proxies, run_initializer, tmp_path
):
    files = dataset(33, {"model.safetensors": 72 * MIB})
    web.put("/x/model.safetensors", files["model.safetensors"])
    archive = io.BytesIO()
    members = dataset(34, {f"cfg/part-{i}.json": 20_000 + i for i in range(8)})
    with zipfile.ZipFile(archive, "w") as packed:
        for name, body in members.items():
            packed.writestr(name, body)
    web.put("/x/config.zip", archive.getvalue())
    proxy = proxies(web.url, seed=35, share=0.35, faults=every_fault(stall_seconds=30))
    for path, expected, out in (
        ("/x/model.safetensors", files, tmp_path / "weights"),
        ("/x/config.zip", members, tmp_path / "config"),
    ):
        result = run_initializer(
            "model", "--storage-uri", proxy.url + path, "--output", str(out), env={"TIMEOUT": "1"}
        )
        assert result.code == 0, result.output
        assert_identical(out, expected)
        assert find_problems(out) == []
    assert proxy.total_injected > 0


def test_a_file_replaced_on_the_server_during_the_fetch_fails_instead_of_mixing(
    web, proxies, launch, tmp_path
):
    web.put("/x/model.safetensors", b"a" * (3 * MIB))
    proxy = proxies(web.url)
    proxy.hold(lambda request: request.range != "bytes=0-0")  # the listing passes, the GET waits
    out = tmp_path / "model"
    url = proxy.url + "/x/model.safetensors"
    live = launch("model", "--storage-uri", url, "--output", str(out), env={})
    proxy.wait_parked()
    web.put("/x/model.safetensors", b"b" * (3 * MIB))  # same size, a new ETag
    proxy.release()
    assert live.finish(timeout=60) == 5, live.stderr
    assert "changed on the server while it was being fetched" in live.stderr
    assert not (out / "model.safetensors").exists()

"""A full disk while an export writes any of its files is one line saying so, and leaves nothing behind.

OpenVINO reports a failed write as `basic_ios::clear: iostream error`, with no errno; the export tells a full disk
apart by the free space left. The real case runs on a small tmpfs in a private mount namespace (it vanishes with
the process, so nothing stays mounted); the simulated cases cover each kind of write without one.
"""

from __future__ import annotations

import collections
import errno
import math
import os
import shutil
import subprocess
import sys

import pytest

import ovbuild.export.package as package

from export_helpers import REPO, assert_clean_error, ovbuild, snapshot

PAGE = 4096


def can_mount_tmpfs(tmp_path) -> bool:
    probe = ["unshare", "--mount", "sh", "-c", f"mount -t tmpfs -o size=64k tmpfs {tmp_path}"]
    return shutil.which("unshare") is not None and subprocess.run(probe, capture_output=True).returncode == 0


def export_on_tmpfs(tmp_path, tiny_target, size: int) -> tuple[int, str, list[str]]:
    """Export the tiny target into a `size`-byte tmpfs; exit code, stderr, and what is left in the tmpfs."""
    mnt = tmp_path / "mnt"
    mnt.mkdir(exist_ok=True)
    script = (
        f'mount -t tmpfs -o size={size} tmpfs "{mnt}" && "{sys.executable}" -m ovbuild.cli export '
        f'-m "{tiny_target}" "{mnt}/out" -q; echo "exit $?"; ls -A "{mnt}"'
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(["unshare", "--mount", "sh", "-c", script], capture_output=True, text=True, env=env)
    lines = done.stdout.splitlines()
    return int(lines[0].split()[1]), done.stderr, lines[1:]


def test_a_full_tmpfs(tmp_path, tiny_target):
    """Too small for the model IR, and one page short of the whole export: the last file written fails."""
    if not can_mount_tmpfs(tmp_path):
        pytest.skip("no private mount namespace here (needs root or CAP_SYS_ADMIN); simulated cases below")
    # Made by a fresh process too: the XML holds node names numbered per process, so its size depends on the process.
    reference = [sys.executable, "-m", "ovbuild.cli", "export", "-m", tiny_target, tmp_path / "reference", "-q"]
    subprocess.run(reference, check=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    # tmpfs counts whole pages: every file of the export, plus the lock file held while it runs.
    pages = sum(math.ceil(p.stat().st_size / PAGE) for p in (tmp_path / "reference").iterdir()) + 1
    for size, failing in [(1 << 20, "openvino_model.xml"), ((pages - 1) * PAGE, "openvino_detokenizer.xml")]:
        code, err, left = export_on_tmpfs(tmp_path, tiny_target, size)
        lines = err.splitlines()
        assert code == 2 and len(lines) == 1 and lines[0].endswith(": cannot be written (No space left on device)"), err
        assert f"/out/{failing}:" in lines[0], lines[0]
        assert left == [], f"left on the tmpfs: {left}"


Usage = collections.namedtuple("Usage", "total used free")


def fail_with(original, exc: BaseException, writing: str):
    """`original`, except that writing a file whose path holds `writing` raises `exc`."""

    def fail(*args, **kwargs):
        if any(writing in str(a) for a in args[:2]):
            raise exc
        return original(*args, **kwargs)

    return fail


IOSTREAM = RuntimeError("Exception from src/core/src/pass/serialize.cpp:1234:\nbasic_ios::clear: iostream error")
ENOSPC = OSError(errno.ENOSPC, "No space left on device")
# (id, function, path written, exception, free bytes reported, message)
SIMULATED = [
    ("IR, disk full", "save_ir", "openvino_model", IOSTREAM, 0,
     "out/openvino_model.xml: cannot be written (No space left on device)"),
    ("IR, another failure", "save_ir", "openvino_model", IOSTREAM, 1 << 40,
     "out/openvino_model.xml: cannot be written (basic_ios::clear: iostream error)"),
    ("copied file", "shutil.copyfile", "tokenizer.json", ENOSPC, 1 << 40,
     "out/tokenizer.json: cannot be written (No space left on device)"),
    ("quota", "shutil.copyfile", "config.json", OSError(errno.EDQUOT, "Disk quota exceeded"), 1 << 40,
     "out/config.json: cannot be written (Disk quota exceeded)"),
    ("written generation_config.json", "Path.write_text", "generation_config.json", ENOSPC, 1 << 40,
     "out/generation_config.json: cannot be written (No space left on device)"),
    ("tokenizer IR", "ov.save_model", "openvino_tokenizer", IOSTREAM, 0,
     "out/openvino_tokenizer.xml: cannot be written (No space left on device)"),
    ("detokenizer IR", "ov.save_model", "openvino_detokenizer", IOSTREAM, 0,
     "out/openvino_detokenizer.xml: cannot be written (No space left on device)"),
]  # fmt: skip


@pytest.mark.parametrize(
    "where, writing, exc, free, message", [c[1:] for c in SIMULATED], ids=[c[0] for c in SIMULATED]
)
def test_a_failed_write_is_one_line(tmp_path, capsys, monkeypatch, tiny_target, where, writing, exc, free, message):
    owner = package
    *parents, name = where.split(".")
    for parent in parents:
        owner = getattr(owner, parent)
    checkpoint = shutil.copytree(tiny_target, tmp_path / "ckpt")
    (checkpoint / "generation_config.json").unlink()  # so that the export writes one of its own
    monkeypatch.setattr(owner, name, fail_with(getattr(owner, name), exc, writing))
    monkeypatch.setattr(package.shutil, "disk_usage", lambda path: Usage(1 << 41, (1 << 41) - free, free))
    before = snapshot(tmp_path)
    run = ovbuild(capsys, "export", "-m", checkpoint, tmp_path / "out")
    assert_clean_error(run, message)
    assert snapshot(tmp_path) == before

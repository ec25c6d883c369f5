"""OUT is never lost or clobbered: without --overwrite, whatever appears at OUT while an export runs stays, and of
several exports racing to one OUT exactly one wins; with renameat2 and with the fallback used where it is missing."""

from __future__ import annotations

import os

import pytest

import ovbuild.export.package as package
import ovbuild.export.renames as renames
from ovbuild.ir import read_ir

from export_helpers import assert_clean_error, finish, ovbuild, snapshot, start_paused

APPEARED = (
    "out: already exists (it appeared while this export ran and was left as it is; pass --overwrite to replace it)"
)


def make_empty(out):
    out.mkdir()


def make_filled(out):
    out.mkdir()
    (out / "mine.txt").write_text("mine")


def make_file(out):
    out.write_text("mine")


@pytest.fixture(params=["renameat2", "fallback"])
def rename_path(request, monkeypatch):
    """Both ways of moving a folder into place: renameat2 (Linux) and the portable fallback."""
    if request.param == "fallback":
        monkeypatch.setattr(renames, "_renameat2", None)
    return request.param


@pytest.mark.parametrize("appear", [make_empty, make_filled, make_file], ids=["empty folder", "folder", "file"])
def test_an_out_that_appears_during_the_export_is_left_alone(
    tmp_path, capsys, monkeypatch, tiny_target, rename_path, appear
):
    """An empty folder is the sharp case: a plain rename(2) silently replaces an empty directory."""
    out = tmp_path / "run" / "out"
    copy_files = package.Package.copy_files

    def someone_else_writes_out(self, *args):
        appear(out)
        return copy_files(self, *args)

    monkeypatch.setattr(package.Package, "copy_files", someone_else_writes_out)
    run = ovbuild(capsys, "export", "-m", tiny_target, out)
    assert_clean_error(run, APPEARED)
    (tmp_path / "expected").mkdir()
    appear(tmp_path / "expected" / "out")
    assert snapshot(tmp_path / "run") == snapshot(tmp_path / "expected")
    assert all(p.read_text() == "mine" for p in [out, *out.rglob("*")] if p.is_file())


def test_overwrite_does_not_replace_a_user_folder_that_appeared(tmp_path, capsys, monkeypatch, tiny_target):
    out = tmp_path / "out"
    copy_files = package.Package.copy_files

    def someone_else_writes_out(self, *args):
        make_filled(out)
        return copy_files(self, *args)

    monkeypatch.setattr(package.Package, "copy_files", someone_else_writes_out)
    run = ovbuild(capsys, "export", "-m", tiny_target, out, "--overwrite")
    assert_clean_error(run, "out: is not an exported folder (no openvino_model.xml); refusing to replace it")
    assert snapshot(tmp_path) == {"out", "out/mine.txt"}


def test_racing_exports_to_one_out(tmp_path, capsys, tiny_target):
    """Three exports held just before their move into place, then let go at once: one wins, the others exit 2
    with one line, and the winner's folder is complete (the same files and bytes as an export made alone)."""
    ovbuild(capsys, "export", "-m", tiny_target, tmp_path / "alone", "-q")
    alone = contents(tmp_path / "alone")
    out, go = tmp_path / "race" / "out", tmp_path / "go"
    where = "ovbuild.export.output_folder:move_noreplace"
    children = [start_paused(where, ["export", "-m", tiny_target, out, "-q"], go) for _ in range(3)]
    go.touch()
    runs = [finish(child) for child in children]
    assert sorted(run.code for run in runs) == [0, 2, 2], [(run.code, run.err) for run in runs]
    for run in runs:
        if run.code == 2:
            assert_clean_error(run, APPEARED)
        else:
            assert run.err == ""
    assert os.listdir(tmp_path / "race") == ["out"]
    assert contents(out) == alone
    for name in ("openvino_model.xml", "openvino_tokenizer.xml", "openvino_detokenizer.xml"):
        read_ir(out / name)


def contents(folder) -> dict[str, bytes | None]:
    """Every file's bytes; XML files only by name (auto-generated node names count the nodes a process made)."""
    return {p: None if p.endswith(".xml") else (folder / p).read_bytes() for p in snapshot(folder)}

"""Ctrl-C and SIGTERM end any command with one line (exit 130 / 143) after it has cleaned up: an export leaves no
partial folder, and an interrupted --overwrite leaves the old or the new export at OUT, never neither. A SIGKILL
cannot be cleaned up after, so the next export into the same folder does it."""

from __future__ import annotations

import os
import signal

import pytest

import ovbuild.export.output_folder as output_folder
import ovbuild.export.package as package
import ovbuild.export.renames as renames
from ovbuild.ir import read_ir
from ovbuild.ir.rt_info import flat_rt_info
from ovbuild.runtime.scheduler import Scheduler
from ovbuild.signals import deliver

from export_helpers import assert_one_line, finish, ovbuild, snapshot, start_paused

pytestmark = pytest.mark.slow  # end to end: `pytest -m "not slow"` leaves it out

INTERRUPTED, TERMINATED = "ovbuild: interrupted", "ovbuild: terminated"
OUTCOMES = {signal.SIGINT: (130, INTERRUPTED), signal.SIGTERM: (143, TERMINATED)}


@pytest.fixture(autouse=True)
def sigint_as_on_a_terminal():
    """SIGINT with Python's usual handler, as on a terminal: the tests here deliver it through the current handler,
    and a non-interactive shell starts background jobs (pytest among them) with SIGINT ignored."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def weight_format(folder) -> str:
    return flat_rt_info(read_ir(folder))["ovbuild/weight_format"]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_during_an_export_leaves_nothing(tmp_path, tiny_target, sig):
    """A real signal from outside, while the child has written its IR into the partial folder and is about to copy
    the tokenizer: one line, 130 / 143, and no partial folder, no lock file, no parent folder made for OUT."""
    before = snapshot(tmp_path)
    out = tmp_path / "exports" / "out"
    child = start_paused(
        "ovbuild.export.package:Package.copy_files", ["export", "-m", tiny_target, out], tmp_path / "go"
    )
    written = {p.rsplit("/", 1)[-1] for p in snapshot(tmp_path) - before if ".partial/" in p}
    assert {"openvino_model.xml", "openvino_model.bin"} <= written, written
    child.send_signal(sig)
    assert_one_line(finish(child), *OUTCOMES[sig])
    assert snapshot(tmp_path) == before, f"left behind: {snapshot(tmp_path) - before}"


def raise_signal_around(monkeypatch, owner, name: str, sig: int, after: bool = False, nth: int = 1) -> None:
    """Make the `nth` call of `owner.name` in this process take `sig`, before or after running.

    The Python handler is run where Python would run it (between two statements of the main thread), without the
    system delivering the signal: delivery is what the child-process tests check, and here it could crash pytest
    (OpenVINO's CPU plugin leaves the main thread's alternate signal stack pointing at memory it later unmaps, and
    Python's handlers run on that stack).
    """
    original, calls = getattr(owner, name), [0]

    def wrapped(*args, **kwargs):
        calls[0] += 1
        if calls[0] == nth and not after:
            deliver(sig)
        result = original(*args, **kwargs)
        if calls[0] == nth and after:
            deliver(sig)
        return result

    monkeypatch.setattr(owner, name, wrapped)


# Where an --overwrite export over an fp32 export is interrupted, and which export OUT then holds. Moving the new
# folder into place holds signals back until it is done, so a signal there lands after it: the new export stays.
OVERWRITE_POINTS = [
    ("SIGTERM while building", package.Package, "copy_files", signal.SIGTERM, False, 1, "fp32"),
    ("Ctrl-C while building", package.Package, "copy_files", signal.SIGINT, False, 1, "fp32"),
    ("Ctrl-C during the exchange", output_folder, "exchange", signal.SIGINT, False, 1, "fp16"),
    ("Ctrl-C after the exchange", output_folder, "exchange", signal.SIGINT, True, 1, "fp16"),
    ("SIGTERM between the fallback's renames", os, "rename", signal.SIGTERM, True, 1, "fp16"),
    ("Ctrl-C between the fallback's renames", os, "rename", signal.SIGINT, True, 1, "fp16"),
]


@pytest.mark.parametrize(
    "owner, name, sig, after, nth, expected", [p[1:] for p in OVERWRITE_POINTS], ids=[p[0] for p in OVERWRITE_POINTS]
)
def test_an_interrupted_overwrite_leaves_the_old_or_the_new_export(
    tmp_path, capsys, monkeypatch, tiny_draft, tiny_target, owner, name, sig, after, nth, expected
):
    out = tmp_path / "out"
    args = ["export", "-m", tiny_draft, out, "--target-model", tiny_target, "--overwrite"]
    assert ovbuild(capsys, *args, "--weight-format", "fp32").code == 0
    if owner is os:  # the two-rename replace used where renameat2 is missing
        monkeypatch.setattr(renames, "_renameat2", None)
    raise_signal_around(monkeypatch, owner, name, sig, after, nth)
    run = ovbuild(capsys, *args, "--weight-format", "fp16")
    assert_one_line(run, *OUTCOMES[sig])
    assert weight_format(out) == expected
    assert snapshot(tmp_path) == {f"out/{p}" for p in snapshot(out)} | {"out"}, snapshot(tmp_path)


def test_ctrl_c_while_generating(tmp_path, capsys, monkeypatch, tiny_target):
    assert ovbuild(capsys, "export", "-m", tiny_target, tmp_path / "target", "-q").code == 0
    raise_signal_around(monkeypatch, Scheduler, "step", signal.SIGINT, nth=2)
    run = ovbuild(capsys, "generate", "--target", tmp_path / "target", "--prompt", "def f(x):")
    assert_one_line(run, 130, INTERRUPTED)


def test_sigterm_while_inspecting(tmp_path, capsys, monkeypatch, tiny_target):
    import ovbuild.commands.inspect as inspect_command

    assert ovbuild(capsys, "export", "-m", tiny_target, tmp_path / "target", "-q").code == 0
    raise_signal_around(monkeypatch, inspect_command, "format_report", signal.SIGTERM)
    assert_one_line(ovbuild(capsys, "inspect", tmp_path / "target"), 143, TERMINATED)


def test_the_next_export_cleans_up_after_a_killed_one(tmp_path, capsys, tiny_draft, tiny_target):
    """SIGKILL between the two renames of a replace without renameat2 (the worst moment: OUT is missing and the old
    export is aside): the next export into the same folder puts the old export back and removes the new one's
    partial folder and lock; the owner is known dead because its flock is free."""
    out = tmp_path / "out"
    args = ["export", "-m", tiny_draft, out, "--target-model", tiny_target, "--overwrite"]
    assert ovbuild(capsys, *args, "--weight-format", "fp32").code == 0
    (out / "marker").write_text("old export")
    old = snapshot(out)
    child = start_paused("os:rename", [*args, "--weight-format", "fp16"], tmp_path / "go", nth=2, fallback=True)
    child.kill()
    assert finish(child).code == -signal.SIGKILL
    left = {p for p in os.listdir(tmp_path)}
    stem = f".out.ovbuild-{child.pid}-"
    assert "out" not in left and {n.rsplit(".", 1)[-1] for n in left if n.startswith(stem)} == {
        "lock",
        "old",
        "partial",
    }

    run = ovbuild(capsys, "export", "-m", tiny_target, tmp_path / "next", "-q")
    assert run.code == 0, run.err
    assert sorted(os.listdir(tmp_path)) == ["next", "out"]
    assert snapshot(out) == old and (out / "marker").read_text() == "old export" and weight_format(out) == "fp32"


def test_a_live_exports_partial_folder_is_left_alone(tmp_path, capsys, tiny_target):
    """Its owner holds the lock: another export into the same folder must not touch it, and it finishes fine."""
    go = tmp_path / "go"
    child = start_paused("ovbuild.export.package:Package.copy_files", ["export", "-m", tiny_target, tmp_path / "a"], go)
    partial = {p for p in snapshot(tmp_path) if p.endswith(".partial/openvino_model.bin")}
    assert ovbuild(capsys, "export", "-m", tiny_target, tmp_path / "b", "-q").code == 0
    assert partial <= snapshot(tmp_path)
    go.touch()
    assert finish(child).code == 0
    go.unlink()
    assert sorted(os.listdir(tmp_path)) == ["a", "b"]

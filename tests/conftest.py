"""Shared fixtures: tiny checkpoints written once per test session (deterministic by seed), and the one way a test
gets an exported pair: `export_pair` (the target with the draft's taps, the draft with the target's tables, as a user
exports them), for the tiny random pair (`tiny_pair`) and the shipped demo pair (`demo_pair`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ovbuild.families import load_draft
from ovbuild.graph.dflash import build_dflash_draft
from ovbuild.graph.target import build_target
from ovbuild.runtime.model import machine
from ovbuild.runtime.pipeline import Pipeline
from ovbuild.targets import load_target
from ovbuild.testing import write_tiny_dflash, write_tiny_target
from ovbuild.weights.checkpoint import Checkpoint


@pytest.fixture(scope="session")
def ckpt_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("ckpt")


@pytest.fixture(scope="session")
def tiny_target(ckpt_dir):
    return write_tiny_target(ckpt_dir / "target")


@pytest.fixture(scope="session")
def tiny_target_bf16(ckpt_dir):
    return write_tiny_target(ckpt_dir / "target_bf16", dtype="bf16")


@pytest.fixture(scope="session")
def tiny_draft(ckpt_dir):
    return write_tiny_dflash(ckpt_dir / "draft")


@pytest.fixture(scope="session")
def tiny_draft_bf16(ckpt_dir):
    return write_tiny_dflash(ckpt_dir / "draft_bf16", dtype="bf16")


@pytest.fixture(scope="session")
def target(tiny_target):
    """(TargetConfig, WeightSource) of the f32 tiny target."""
    return load_target(Checkpoint.open(tiny_target))


@pytest.fixture(scope="session")
def draft(tiny_draft):
    """(DraftConfig, WeightSource) of the f32 tiny DFlash draft."""
    return load_draft(Checkpoint.open(tiny_draft))


@pytest.fixture(scope="module")
def models(target, draft):
    """The f32 tiny target IR with the draft's taps and the draft IR, built once per test module."""
    (tcfg, tweights), (dcfg, dweights) = target, draft
    return build_target(tcfg, tweights, dcfg.target_layer_ids), build_dflash_draft(dcfg, dweights, tweights)


@pytest.fixture
def bf16_units(monkeypatch):
    """The CPU plugin's capabilities as a CPU with bf16 units reports them, to the rules that read them
    (ovbuild.runtime.model.machine.cpu_capabilities; the rules on CPU flags read machine.cpu_flags, which tests patch
    the same way): so that those rules are tested on every CPU. Compile nothing under it: the plugin itself still
    computes on this CPU's terms."""
    monkeypatch.setattr(machine, "cpu_capabilities", lambda: ["FP32", "BF16", "INT8", "BIN", "EXPORT_IMPORT"])


def export_pair(target_ckpt: Path, draft_ckpt: Path, root: Path) -> tuple[Path, Path]:
    """(target folder, draft folder) exported into `root` as a user exports a pair (default weight formats)."""
    from ovbuild.demo import export_pair as export_as_a_user_does

    return export_as_a_user_does(target_ckpt, draft_ckpt, root)


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory, tiny_target, tiny_draft):
    """The tiny target and DFlash draft, exported once per session (tests that change a file copy the folder)."""
    return export_pair(tiny_target, tiny_draft, tmp_path_factory.mktemp("tiny_pair"))


@pytest.fixture(scope="session")
def demo_pair(tmp_path_factory):
    """The shipped demo pair (a trained target and draft), exported once per session."""
    from ovbuild.demo import shipped_pair

    return export_pair(*shipped_pair(), tmp_path_factory.mktemp("demo_pair"))


@pytest.fixture(scope="module")
def demo_pipeline(demo_pair):
    """A Pipeline on the demo pair with the default runtime options, compiled once per test module."""
    return Pipeline(*demo_pair)


@pytest.fixture(autouse=True)
def own_cache_dir(tmp_path_factory, monkeypatch):
    """Every test keeps what ovbuild caches (the planner's calibration) in a folder of its own: nothing lands in the
    user's cache, and no test finds another's calibration."""
    monkeypatch.setenv("OVBUILD_CACHE_DIR", str(tmp_path_factory.mktemp("ovbuild_cache")))

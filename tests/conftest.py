"""Shared fixtures: tiny checkpoints written once per test session (deterministic by seed)."""

from __future__ import annotations

import pytest

from ovbuild.families import load_draft
from ovbuild.graph.dflash import build_dflash_draft
from ovbuild.graph.target import build_target
from ovbuild.runtime import machine
from ovbuild.testing import write_tiny_dflash, write_tiny_target
from ovbuild.weights.checkpoint import Checkpoint
from ovbuild.weights.target import load_target


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
    (ovbuild.runtime.machine.cpu_capabilities; the rules on CPU flags read machine.cpu_flags, which tests patch the
    same way): so that those rules are tested on every CPU. Compile nothing under it: the plugin itself still
    computes on this CPU's terms."""
    monkeypatch.setattr(machine, "cpu_capabilities", lambda: ["FP32", "BF16", "INT8", "BIN", "EXPORT_IMPORT"])


@pytest.fixture(autouse=True)
def own_cache_dir(tmp_path_factory, monkeypatch):
    """Every test keeps what ovbuild caches (the planner's calibration) in a folder of its own: nothing lands in the
    user's cache, and no test finds another's calibration."""
    monkeypatch.setenv("OVBUILD_CACHE_DIR", str(tmp_path_factory.mktemp("ovbuild_cache")))

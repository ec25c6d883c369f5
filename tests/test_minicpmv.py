"""MiniCPM-V 4.7 targets (1B-like dense hybrid, A3B-like MoE) and the Qwen3.5 MoE target with their DSpark drafts:
config resolution by `text_config.model_type`, the vision tensors never read, DSpark keys flat or nested in
`dflash_config`, export / inspect / generate through the CLI, and lossless speculative decoding (greedy, several
concurrent requests, the draft steered to accept) equal to the target alone."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_speculative import assert_accepted, prompts, run

from ovbuild.cli import main
from ovbuild.errors import OvbuildError, UnsupportedError
from ovbuild.families import load_draft
from ovbuild.graph.dspark import build_dspark_draft, build_markov_head
from ovbuild.graph.hybrid_target import build_hybrid_target
from ovbuild.runtime.model.paged_model import PagedModel
from ovbuild.runtime.request import GenerationConfig
from ovbuild.runtime.scheduler import Scheduler
from ovbuild.runtime.speculation.drafters import DSparkDrafter
from ovbuild.targets import load_target, parse_target_config
from ovbuild.testing.planner import fixed_speculation
from ovbuild.testing.steered import SteeredDrafter
from ovbuild.testing.tiny_moe import (
    MINICPMV_TEXT,
    MINICPMV_TOP,
    write_tiny_hybrid_dspark,
    write_tiny_minicpmv,
    write_tiny_moe_target,
)
from ovbuild.weights.checkpoint import Checkpoint
from ovbuild.weights.hybrid import HybridTargetConfig

F32 = dict(kv_cache_precision="f32")
VISION = ("model.vision_tower.", "model.merger.")
TARGETS = {
    "minicpmv_1b": ("1b", "vanilla", True),
    "minicpmv_a3b": ("a3b", "gated", True),
    "qwen_moe": (None, "vanilla", False),
}


def write_pair(root, name: str):
    """(target folder, draft folder) of pair `name`: the MiniCPM-V drafts nest their keys in dflash_config."""
    kind, draft_kind, nested = TARGETS[name]
    target = write_tiny_minicpmv(root / f"{name}_t", kind) if kind else write_tiny_moe_target(root / f"{name}_t")
    return target, write_tiny_hybrid_dspark(root / f"{name}_d", draft_kind, nested=nested)


def test_text_config_resolves_by_its_model_type():
    assert (
        type(parse_target_config({**MINICPMV_TOP, "text_config": MINICPMV_TEXT["1b"]}, "c.json")) is HybridTargetConfig
    )
    cfg = parse_target_config({**MINICPMV_TOP, "text_config": MINICPMV_TEXT["a3b"]}, "c.json")
    assert cfg.moe is not None and cfg.moe.num_experts == 8
    bad = {**MINICPMV_TOP, "text_config": {**MINICPMV_TEXT["1b"], "model_type": "qwen2"}}
    with pytest.raises(UnsupportedError, match=r"text_config\.model_type' = 'qwen2' is not a Qwen3\.5-family"):
        parse_target_config(bad, "c.json")


def test_nested_and_flat_dspark_keys_read_alike(tmp_path):
    flat, _ = load_draft(Checkpoint.open(write_tiny_hybrid_dspark(tmp_path / "f", "vanilla")))
    try:
        nested, _ = load_draft(Checkpoint.open(write_tiny_hybrid_dspark(tmp_path / "n", "vanilla", nested=True)))
    except OvbuildError as e:
        pytest.fail(f"the keys nested in dflash_config were not read: {e}")
    config = json.loads((tmp_path / "n" / "config.json").read_text())
    assert "markov_rank" not in config and config["dflash_config"]["markov_rank"] == 16
    assert flat == nested
    assert (nested.markov_rank, nested.block_size, nested.target_layer_ids) == (16, 6, (0, 1, 2))
    assert nested.confidence_head_with_markov


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Every pair exported through the CLI, recording which checkpoint tensors were read."""
    root = tmp_path_factory.mktemp("minicpmv_cli")
    read: list[str] = []
    original = Checkpoint.get

    def recording(self, name, shape=None):
        read.append(name)
        return original(self, name, shape)

    Checkpoint.get = recording
    try:
        folders = {}
        for name in TARGETS:
            target, draft = write_pair(root, name)
            common = ["--weight-format", "keep", "--quiet"]
            # the language model alone (its vision tower is tests/test_vision_minicpm_export.py's)
            target_args = ["--draft-of", str(draft), "--no-vision", *common]
            assert main(["export", "-m", str(target), str(root / f"{name}_et"), *target_args]) == 0
            assert (
                main(["export", "-m", str(draft), str(root / f"{name}_ed"), "--target-model", str(target), *common])
                == 0
            )
            folders[name] = (root / f"{name}_et", root / f"{name}_ed")
    finally:
        Checkpoint.get = original
    return folders, read


def test_vision_tensors_are_never_read(exported):
    _, read = exported
    assert any(n.startswith("model.language_model.layers.0.mlp.experts") for n in read)
    assert not [n for n in read if n.startswith(VISION)]


@pytest.mark.parametrize("name", list(TARGETS))
def test_export_inspect_generate(exported, tmp_path, capsys, name):
    target, draft = exported[0][name]
    assert main(["inspect", str(target)]) == 0
    assert "layers LLLF" in capsys.readouterr().out
    asks = [a for p in ["def add(a, b):", "The quick brown fox"] for a in ("--prompt", p)]
    runs = []
    for extra in ([], ["--draft", str(draft), "--num-assistant-tokens", "3"]):
        out = tmp_path / f"{len(runs)}.json"
        assert (
            main(["generate", "--target", str(target), "--max-new-tokens", "8", "--json", str(out), *asks, *extra]) == 0
        )
        runs.append(json.loads(out.read_text()))
    alone, spec = ([r["generated_ids"] for r in run_["requests"]] for run_ in runs)
    assert spec == alone and all(len(ids) == 8 for ids in alone)
    assert runs[1]["totals"]["num_draft_tokens"] > 0


def test_the_genai_form_is_refused_in_one_line(tmp_path, capsys):
    from export_helpers import assert_clean_error, ovbuild

    target, _ = write_pair(tmp_path, "minicpmv_a3b")
    run = ovbuild(capsys, "export", "-m", target, tmp_path / "g", "--format", "genai", "--quiet")
    assert_clean_error(
        run, "MiniCPMV4_7ForConditionalGeneration (qwen3_5): the genai IR format exists for qwen3 targets only"
    )


@pytest.mark.parametrize("name", ["qwen_moe", "minicpmv_1b"])
def test_speculative_decoding_is_lossless(tmp_path, name):
    """Four requests arriving over the first steps; the DSpark draft as it is and steered to accept (every
    accepted-prefix length 0..3 occurs): the target alone's greedy tokens exactly."""
    target, draft = write_pair(tmp_path, name)
    tcfg, tweights = load_target(Checkpoint.open(target))
    dcfg, dweights = load_draft(Checkpoint.open(draft))
    target_ir = build_hybrid_target(tcfg, tweights, dcfg.target_layer_ids)
    backbone, head = build_dspark_draft(dcfg, dweights, tweights), build_markov_head(dcfg, dweights)

    def make(with_draft: bool, steer: int | None = None) -> Scheduler:
        drafter = DSparkDrafter(backbone, head, num_blocks=64, **F32) if with_draft else None
        if drafter is not None and steer is not None:
            drafter = SteeredDrafter(drafter, tcfg.vocab_size, seed=steer)
        model = PagedModel(target_ir, num_blocks=64, **F32)
        return Scheduler(model, drafter, max_num_batched_tokens=48, speculation=fixed_speculation(drafter))

    rng = np.random.default_rng(3)
    config = GenerationConfig(max_new_tokens=14, num_assistant_tokens=3)
    arrivals = [(int(rng.integers(0, 3)), p, config) for p in prompts(rng, 4)]
    alone = run(make(False), arrivals)
    assert run(make(True), arrivals) == alone
    steered = make(True, steer=4)
    assert run(steered, arrivals, truths=alone) == alone
    assert_accepted(steered, 3)

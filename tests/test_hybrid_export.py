"""`ovbuild export` / `inspect` on the tiny hybrid target and its DFlash draft: family detection, the layer pattern,
the IR contract's ports and rt_info, and clear errors for what is not supported."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ovbuild.families import load_draft
from ovbuild.ir import read_ir
from ovbuild.ir.rt_info import get_rt_info
from ovbuild.reference.dflash import DFlashReference
from ovbuild.runtime.model.paged_model import PagedModel
from ovbuild.targets import load_target
from ovbuild.testing import F32_NMSE
from ovbuild.testing.tiny_hybrid import write_tiny_hybrid_dflash, write_tiny_hybrid_target
from ovbuild.weights.checkpoint import Checkpoint

from export_helpers import DRAFT_SCHEDULE, assert_clean_error, ovbuild
from paged_helpers import run_draft


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("hybrid_ckpt")
    return write_tiny_hybrid_target(root / "target"), write_tiny_hybrid_dflash(root / "draft")


@pytest.fixture(scope="module")
def exported(tmp_path_factory, checkpoints):
    from ovbuild.cli import main

    target, draft = checkpoints
    root = tmp_path_factory.mktemp("hybrid_out")
    assert (
        main(
            [
                "export",
                "-m",
                str(target),
                str(root / "t"),
                "--draft-of",
                str(draft),
                "--weight-format",
                "keep",
                "--quiet",
            ]
        )
        == 0
    )
    assert (
        main(
            [
                "export",
                "-m",
                str(draft),
                str(root / "d"),
                "--target-model",
                str(target),
                "--weight-format",
                "keep",
                "--quiet",
            ]
        )
        == 0
    )
    return root


def test_export_detects_the_family_and_writes_the_contract(exported):
    model = read_ir(exported / "t")
    assert get_rt_info(model, "ovbuild/family") == "qwen3_5"
    assert get_rt_info(model, "ovbuild/layer_pattern") == "LLLF"
    assert (
        get_rt_info(model, "ovbuild/layer_types") == "linear_attention,linear_attention,linear_attention,full_attention"
    )
    assert get_rt_info(model, "ovbuild/target_layer_ids") == "0,2,3"
    assert get_rt_info(model, "ovbuild/linear_attention/layers") == "0,1,2"
    geometry = [get_rt_info(model, f"ovbuild/linear_attention/{k}") for k in ("conv_dim", "conv_kernel")]
    assert geometry == ["160", "4"]
    inputs = {p.get_any_name(): p for p in model.inputs}
    outputs = {p.get_any_name(): p for p in model.outputs}
    assert {n for n in inputs if "_cache." in n} == {"key_cache.3", "value_cache.3"}
    assert str(inputs["conv_state.1"].get_partial_shape()) == "[?,160,3]"
    assert str(inputs["recurrent_state.2"].get_partial_shape()) == "[?,4,16,24]"
    assert str(outputs["recurrent_state_out.0"].get_partial_shape()) == "[?,4,16,24]"
    assert {"logits", "greedy_ids", "hidden_states", "conv_state_out.2"} <= set(outputs)
    assert json.loads((exported / "t" / "config.json").read_text())["model_type"] == "qwen3_5"


def test_inspect_shows_the_layer_pattern(exported, capsys):
    run = ovbuild(capsys, "inspect", exported / "t")
    assert run.code == 0, run.err
    assert "family qwen3_5" in run.out
    assert "layers LLLF (3 linear attention, 1 full attention)" in run.out
    assert "recurrent_state.0" in run.out


def test_exported_draft_runs_on_the_hybrid_targets_head(exported, checkpoints):
    """The DFlash draft borrows the hybrid target's embedding and lm_head under their prefixed names."""
    target, draft = checkpoints
    dcfg, dweights = load_draft(Checkpoint.open(draft))
    _, tweights = load_target(Checkpoint.open(target))
    model = PagedModel(read_ir(exported / "d"), kv_cache_precision="f32")
    out = run_draft(model, DFlashReference(dcfg, dweights, tweights), DRAFT_SCHEDULE)
    assert out.nmse("logits") < F32_NMSE, f"draft logits NMSE {out.nmse('logits'):.1e}"
    assert not np.isnan(out.ir[0][0]["logits"]).any()


def test_unsupported_variants_fail_with_one_clear_line(tmp_path, capsys, checkpoints):
    target, _ = checkpoints
    run = ovbuild(capsys, "export", "-m", target, tmp_path / "g", "--format", "genai", "--quiet")
    assert_clean_error(
        run, "(qwen3_5): the genai IR format exists for qwen3 targets only (qwen3_5 targets export as: paged)"
    )
    moe = write_tiny_hybrid_target(tmp_path / "moe")
    config = json.loads((moe / "config.json").read_text())
    config["architectures"] = ["Qwen3_5MoeForConditionalGeneration"]
    (moe / "config.json").write_text(json.dumps(config))
    run = ovbuild(capsys, "export", "-m", moe, tmp_path / "m", "--quiet")
    assert_clean_error(run, "text_config.model_type' = 'qwen3_5_text' does not fit Qwen3_5MoeForConditionalGeneration")

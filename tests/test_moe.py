"""The Qwen3.5-family MoE target: its config and expert layouts (fused and per expert), the MoE layer in both
routing designs against the numpy reference (packed calls, tied router scores, rows sharing experts), the whole
paged target against the reference, and bad layouts as one-line errors naming the tensor or key."""

from __future__ import annotations

import json

import numpy as np
import openvino as ov
import pytest
from openvino import opset16
from test_hybrid_parity import SCHEDULE, TAPS, run_hybrid

from ovbuild.errors import ConfigError, TensorError, UnsupportedError
from ovbuild.graph.context import BuildContext
from ovbuild.graph.hybrid_target import build_hybrid_target
from ovbuild.graph.moe import MOE_DESIGNS, moe_mlp
from ovbuild.graph.ops import result
from ovbuild.graph.weights import WeightPolicy
from ovbuild.reference.moe import MoeHybridReference, MoeWeights, route
from ovbuild.reference.moe import moe_mlp as ref_moe_mlp
from ovbuild.reference.weights import ReferenceWeights
from ovbuild.runtime.model.paged_model import PagedModel
from ovbuild.targets import load_target, parse_target_config
from ovbuild.testing import F32_NMSE, nmse
from ovbuild.testing.tiny_moe import TIED_EXPERTS, TINY_MOE, TINY_MOE_TEXT, write_tiny_moe_target
from ovbuild.weights.checkpoint import Checkpoint

H = TINY_MOE_TEXT["hidden_size"]


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    return load_target(Checkpoint.open(write_tiny_moe_target(tmp_path_factory.mktemp("moe") / "t")))


def test_config_reads_the_published_keys():
    cfg = parse_target_config(TINY_MOE, "c.json")
    assert cfg.moe is not None and cfg.layer_pattern == "LLLF"
    assert (cfg.moe.num_experts, cfg.moe.top_k) == (8, 3)
    assert (cfg.moe.expert_intermediate_size, cfg.moe.shared_intermediate_size) == (32, 48)
    text = {k: v for k, v in TINY_MOE_TEXT.items() if k != "layer_types"}
    cfg = parse_target_config({**TINY_MOE, "text_config": {**text, "full_attention_interval": 2}}, "c.json")
    assert cfg.layer_pattern == "LFLF"


@pytest.mark.parametrize(
    ("text", "error", "match"),
    [
        ({"num_experts_per_tok": 9}, ConfigError, "text_config.num_experts_per_tok' = 9 is more than num_experts"),
        ({"num_experts": None}, ConfigError, "text_config.num_experts' is missing"),
        ({"norm_topk_prob": False}, UnsupportedError, "text_config.norm_topk_prob"),
        ({"model_type": "qwen3_5_text"}, ConfigError, "text_config.model_type"),
    ],
)
def test_bad_configs_name_the_key(text, error, match):
    with pytest.raises(error, match=match):
        parse_target_config({**TINY_MOE, "text_config": {**TINY_MOE_TEXT, **text}}, "c.json")


def layer_ir(cfg, weights, layer: int, design: str, policy: WeightPolicy | None = None) -> ov.CompiledModel:
    """Layer `layer`'s MoE MLP alone as a compiled model: x [T, H] -> [T, H]."""
    x = opset16.parameter([-1, H], ov.Type.f32, name="x")  # [T, H]: a bare layer, no IR port
    ctx = BuildContext(cfg, weights, policy or WeightPolicy(), None, None)
    out = moe_mlp(ctx, layer, x.output(0), cfg.moe, design)
    model = ov.Model([result(out, "y")], [x], "moe_layer")
    return ov.Core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})


@pytest.mark.parametrize("design", MOE_DESIGNS)
def test_moe_layer_matches_reference_over_packed_calls(moe, design):
    """Calls of 1, 5, 20 and 37 rows (several sequences packed), on every layer; rows whose top-k boundary falls
    between the two experts with equal router rows (the lower index must win), and experts shared by many rows."""
    cfg, weights = moe
    ref_w = ReferenceWeights(weights)
    rng = np.random.default_rng(5)
    ir, ref, boundary_ties, shared = [], [], 0, 0
    for layer in range(cfg.num_layers):
        compiled = layer_ir(cfg, weights, layer, design)
        w = MoeWeights.load(ref_w, layer, cfg.moe, H)
        for rows in (1, 5, 20, 37):
            x = rng.standard_normal((rows, H)).astype(np.float32)
            ir.append(compiled(x)[0].astype(np.float64).ravel())
            ref.append(ref_moe_mlp(x.astype(np.float64), w, cfg.moe.top_k).ravel())
            _, chosen = route(x.astype(np.float64), w.router, cfg.moe.top_k)
            low, high = TIED_EXPERTS
            boundary_ties += int(np.sum(np.any(chosen == low, -1) & ~np.any(chosen == high, -1)))
            shared += int(np.sum(np.bincount(chosen.ravel(), minlength=8) > 1))
    figure = nmse(np.concatenate(ir), np.concatenate(ref))
    print(
        f"MoE layer ({design}) vs reference NMSE {figure:.1e}; rows with a tie at the top-k boundary: {boundary_ties}"
    )
    assert figure < F32_NMSE
    assert boundary_ties > 0 and shared > 0


def test_ties_break_to_the_lower_index_like_torch_topk():
    """The reference's top-k on scores with ties, by hand: equal scores come out in index order."""
    from ovbuild.reference.moe import top_k

    scores = np.array([[0.1, 0.3, 0.3, 0.2, 0.3], [0.5, 0.5, 0.5, 0.5, 0.5]])
    assert top_k(scores, 2).tolist() == [[1, 2], [0, 1]]


# NMSE of the layer against the float64 reference when its weights are stored so
STORED = {"int8": 1e-3, "int4": 3e-2, "fp16": 1e-6, "bf16": 1e-4}


@pytest.mark.parametrize("weight_format", list(STORED))
def test_stored_experts_stay_close_and_router_stays_float(moe, weight_format):
    """Per-expert compression (int4 groups of 16) or a narrower float: the layer stays near the reference; the
    router and shared gate are never integer."""
    cfg, weights = moe
    policy = WeightPolicy(weight_format, group_size=16)
    names = {op.get_friendly_name() for op in build_hybrid_target(cfg, weights, (), policy).get_ops()}
    integer = weight_format.startswith("int")
    assert ("layers.0/mlp/experts/gate_up_proj/weight/codes" in names) == integer
    assert ("layers.0/mlp/experts/down_proj/weight/codes" in names) == integer
    assert not any("mlp/gate/weight/codes" in n or "shared_expert_gate/weight/codes" in n for n in names)
    compiled = layer_ir(cfg, weights, 0, "dense", policy)
    x = np.random.default_rng(1).standard_normal((16, H)).astype(np.float32)
    ref = ref_moe_mlp(x.astype(np.float64), MoeWeights.load(ReferenceWeights(weights), 0, cfg.moe, H), 3)
    figure = nmse(compiled(x)[0], ref)
    assert 0 < figure < STORED[weight_format], f"{weight_format}: NMSE {figure:.1e}"


@pytest.mark.parametrize("per_expert", [False, True])
def test_moe_target_matches_reference(tmp_path, per_expert):
    """The whole paged MoE target over packed prefill, decode and verification calls (fused or per-expert layout)."""
    cfg, weights = load_target(Checkpoint.open(write_tiny_moe_target(tmp_path / "t", per_expert=per_expert)))
    model = PagedModel(build_hybrid_target(cfg, weights, TAPS), kv_cache_precision="f32")
    out = run_hybrid(model, MoeHybridReference(cfg, weights), SCHEDULE)
    figures = {name: out.nmse(name) for name in ("logits", "hidden_states", "conv_state", "recurrent_state")}
    print("MoE target vs reference NMSE: " + ", ".join(f"{k} {v:.1e}" for k, v in figures.items()))
    for name, value in figures.items():
        assert value < F32_NMSE, f"{name} NMSE {value:.2e}"


def _edit(folder, drop: str | None = None, reshape: tuple[str, tuple] | None = None):
    """Rewrite the checkpoint without tensor `drop`, or with tensor reshape[0] of shape reshape[1]."""
    from ovbuild.testing.tiny import write_checkpoint

    ckpt = Checkpoint.open(folder)
    tensors = {n: ckpt.get(n).to_f32() for n in ckpt.tensor_names if n != drop}
    if reshape:
        tensors[reshape[0]] = np.zeros(reshape[1], np.float32)
    config = json.loads((folder / "config.json").read_text())
    del ckpt
    write_checkpoint(folder, config, tensors)


@pytest.mark.parametrize(
    ("per_expert", "drop", "reshape", "match"),
    [
        (
            False,
            "model.language_model.layers.2.mlp.experts.down_proj",
            None,
            r"layers\.2\.mlp\.experts\.down_proj' is missing",
        ),
        (
            True,
            "model.language_model.layers.1.mlp.experts.6.up_proj.weight",
            None,
            r"experts\.6\.up_proj\.weight' is missing",
        ),
        (False, "model.language_model.layers.0.mlp.experts.gate_up_proj", None, r"gate_up_proj' is missing"),
        (
            False,
            None,
            ("model.language_model.layers.3.mlp.experts.gate_up_proj", (8, 32, 64)),
            r"gate_up_proj' has shape \[8, 32, 64\], expected \[8, 64, 64\]",
        ),
    ],
)
def test_bad_expert_tensors_name_the_tensor(tmp_path, per_expert, drop, reshape, match):
    folder = write_tiny_moe_target(tmp_path / "t", per_expert=per_expert)
    _edit(folder, drop, reshape)
    cfg, weights = load_target(Checkpoint.open(folder))
    with pytest.raises(TensorError, match=match):
        build_hybrid_target(cfg, weights)


def test_no_experts_at_all_names_both_layouts(tmp_path):
    folder = write_tiny_moe_target(tmp_path / "t")
    for name in ("gate_up_proj", "down_proj"):
        _edit(folder, f"model.language_model.layers.0.mlp.experts.{name}")
    cfg, weights = load_target(Checkpoint.open(folder))
    with pytest.raises(TensorError, match=r"layer 0 has no experts .*gate_up_proj.*experts\.0\.gate_proj\.weight"):
        build_hybrid_target(cfg, weights)

"""Paged hybrid Qwen3.5-family target: the Qwen3 target's inputs and outputs, plus each linear layer's states.

Inputs: as graph/target.py (key_cache.N / value_cache.N for the full-attention layers N only), and per linear layer N
conv_state.N [S, conv_dim, K-1] and recurrent_state.N [S, Hv, Dk, Dv] (each sequence's state before its first new
row, in subsequence_begins order), and state_rows [Q] i64. Outputs: logits, greedy_ids, hidden_states (with taps),
conv_state_out.N [Q, conv_dim, K-1] and recurrent_state_out.N [Q, Hv, Dk, Dv], the states right after each state
row. The contract is written out in docs/hybrid.md. A target that can take images (cfg.mrope) also has the inputs
of graph/images.py: mrope_offsets [T, 3], image_embeds [I, H], image_rows [I] (docs/vision.md).
"""

from __future__ import annotations

import openvino as ov
import openvino.opset16 as ops

from ovbuild.graph.context import BuildContext
from ovbuild.graph.decoder import embedding, mlp
from ovbuild.graph.gated_attention import gated_attention, zero_centered_norm
from ovbuild.graph.gated_delta import gated_delta_net
from ovbuild.graph.images import image_inputs, place_images
from ovbuild.graph.moe import moe_mlp
from ovbuild.graph.ops import named, parameter, result
from ovbuild.graph.paged_attention import PagedInputs
from ovbuild.graph.rope import mrope_tables, rotary_tables
from ovbuild.graph.step_grid import step_grid
from ovbuild.graph.target import target_outputs
from ovbuild.graph.weights import WeightPolicy
from ovbuild.ir import HeadGeometry, HybridKeys, ImageKeys, TargetIR, write_rt_info
from ovbuild.ir.ports import (
    CONV_STATE,
    CONV_STATE_OUT,
    INPUT_IDS,
    LOGITS_INDICES,
    POSITION_IDS,
    RECURRENT_STATE,
    RECURRENT_STATE_OUT,
    STATE_ROWS,
    SUBSEQUENCE_BEGINS,
)
from ovbuild.weights.draft_config import check_target_layer_ids
from ovbuild.weights.hybrid import HybridTargetConfig
from ovbuild.weights.tensor_names import WeightSource


def build_hybrid_target(
    cfg: HybridTargetConfig,
    weights: WeightSource,
    target_layer_ids: tuple[int, ...] = (),
    policy: WeightPolicy | None = None,
) -> ov.Model:
    """The paged hybrid target IR with the layer outputs at `target_layer_ids` concatenated as hidden_states."""
    if target_layer_ids:
        check_target_layer_ids(tuple(target_layer_ids), cfg.num_layers, "target_layer_ids")
    input_ids = parameter(INPUT_IDS, [-1])
    position_ids = parameter(POSITION_IDS, [-1])
    logits_indices = parameter(LOGITS_INDICES, [-1])
    state_rows = parameter(STATE_ROWS, [-1])
    paged = PagedInputs()
    images = image_inputs(cfg.hidden_size) if cfg.mrope is not None else None
    if images is None:
        tables = rotary_tables(position_ids.output(0), cfg.rope, cfg.rotary_dim)
    else:
        tables = mrope_tables(position_ids.output(0), images.offsets.output(0), cfg.rope, cfg.rotary_dim, cfg.mrope)
    ctx = BuildContext(cfg, weights, policy or WeightPolicy(), paged, tables)
    grid = step_grid(paged.sequence[SUBSEQUENCE_BEGINS].output(0), state_rows.output(0), input_ids.output(0))
    kernel, heads = cfg.linear_conv_kernel_dim, cfg.linear_num_value_heads
    state_inputs, state_outputs = [], []
    x = embedding(ctx, weights, input_ids.output(0))  # [T, H]
    if images is not None:
        x = place_images(x, images)  # [T, H]
    layer_outputs = []
    for i, kind in enumerate(cfg.layer_types):
        u = zero_centered_norm(ctx, x, f"layers.{i}.input_layernorm", cfg.hidden_size)
        if kind == "full_attention":
            mixed = gated_attention(ctx, i, u)
        else:
            conv_in = parameter(CONV_STATE, [-1, cfg.conv_dim, kernel - 1], i)
            shape = [-1, heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim]
            recurrent_in = parameter(RECURRENT_STATE, shape, i)
            mixed, conv_out, recurrent_out = gated_delta_net(ctx, i, u, grid, conv_in.output(0), recurrent_in.output(0))
            state_inputs += [conv_in, recurrent_in]
            state_outputs += [
                result(conv_out, CONV_STATE_OUT, i),
                result(recurrent_out, RECURRENT_STATE_OUT, i),
            ]
        x = named(ops.add(x, mixed), f"layers.{i}/mixer_residual")
        v = zero_centered_norm(ctx, x, f"layers.{i}.post_attention_layernorm", cfg.hidden_size)
        m = moe_mlp(ctx, i, v, cfg.moe) if cfg.moe is not None else mlp(ctx, i, v)
        x = named(ops.add(x, m), f"layers.{i}/output")
        layer_outputs.append(x)
    h = zero_centered_norm(ctx, x, "norm", cfg.hidden_size)  # [T, H]
    layer_outputs[-1] = h  # the last layer's tap is taken after the final norm, as transformers reports it
    outputs = target_outputs(ctx, weights, layer_outputs, logits_indices.output(0), target_layer_ids)
    params = [input_ids, position_ids, *paged.parameters, logits_indices, state_rows, *state_inputs]
    if images is not None:
        params += images.parameters
    model = ov.Model([*outputs, *state_outputs], params, "ovbuild_qwen3_5_target")
    write_rt_info(model, *hybrid_rt_info(cfg, target_layer_ids), ctx.policy.storage())
    if cfg.mrope is not None:
        write_rt_info(model, ImageKeys(cfg.mrope.section, cfg.mrope.interleaved))
    return model


def hybrid_rt_info(cfg: HybridTargetConfig, taps: tuple[int, ...]) -> tuple[TargetIR, HybridKeys]:
    """The Qwen3 target's contract plus the layer pattern and what the runtime needs to size the state pool."""
    target = TargetIR(
        heads=HeadGeometry(cfg.num_kv_heads, cfg.head_dim),
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        target_layer_ids=tuple(taps),
        context_length=cfg.context_length,
        family=cfg.family,
    )
    hybrid = HybridKeys(
        layer_types=tuple(cfg.layer_types),
        layer_pattern=cfg.layer_pattern,
        linear_layers=tuple(cfg.linear_layers),
        conv_dim=cfg.conv_dim,
        conv_kernel=cfg.linear_conv_kernel_dim,
        num_v_heads=cfg.linear_num_value_heads,
        k_head_dim=cfg.linear_key_head_dim,
        v_head_dim=cfg.linear_value_head_dim,
    )
    return target, hybrid

"""Paged Qwen3 target: packed rows of many sequences in, logits of chosen rows and layer taps out.

Inputs: input_ids [T] i64, position_ids [T] i64, the PagedAttention inputs, key_cache.N / value_cache.N,
logits_indices [R] i64. Outputs: logits [R, V] f32 and, when taps are asked for, hidden_states [T, n * H] f32.
"""

from __future__ import annotations

import openvino as ov
import openvino.opset16 as ops

from ovbuild.graph.context import BuildContext
from ovbuild.graph.decoder import decoder_stack, embedding, greedy_ids, lm_head
from ovbuild.graph.ops import Output, i64, named, parameter, result
from ovbuild.graph.paged_attention import PagedInputs
from ovbuild.graph.rope import rotary_tables
from ovbuild.graph.weights import WeightPolicy
from ovbuild.ir import HeadGeometry, TargetIR, write_rt_info
from ovbuild.ir.ports import GREEDY_IDS, INPUT_IDS, LOGITS, LOGITS_INDICES, POSITION_IDS, TAPS
from ovbuild.weights.draft_config import check_target_layer_ids
from ovbuild.weights.target import TargetConfig
from ovbuild.weights.tensor_names import WeightSource


def build_target(
    cfg: TargetConfig, weights: WeightSource, target_layer_ids: tuple[int, ...] = (), policy: WeightPolicy | None = None
) -> ov.Model:
    """The paged target IR with the decoder-layer outputs at `target_layer_ids` concatenated as hidden_states."""
    if target_layer_ids:
        check_target_layer_ids(tuple(target_layer_ids), cfg.num_layers, "target_layer_ids")
    input_ids = parameter(INPUT_IDS, [-1])
    position_ids = parameter(POSITION_IDS, [-1])
    logits_indices = parameter(LOGITS_INDICES, [-1])
    paged = PagedInputs()
    ctx = BuildContext(
        cfg, weights, policy or WeightPolicy(), paged, rotary_tables(position_ids.output(0), cfg.rope, cfg.head_dim)
    )
    layer_outputs = decoder_stack(ctx, embedding(ctx, weights, input_ids.output(0)))  # [T, H] each
    outputs = target_outputs(ctx, weights, layer_outputs, logits_indices.output(0), target_layer_ids)
    params = [input_ids, position_ids, *paged.parameters, logits_indices]
    model = ov.Model(outputs, params, "ovbuild_qwen3_target")
    info = TargetIR(
        heads=HeadGeometry(cfg.num_kv_heads, cfg.head_dim),
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        target_layer_ids=tuple(target_layer_ids),
        context_length=cfg.context_length,
    )
    write_rt_info(model, info, ctx.policy.storage())  # plus how the weights are stored
    return model


def target_outputs(
    ctx: BuildContext,
    weights: WeightSource,
    layer_outputs: list[Output],
    logits_indices: Output,
    target_layer_ids: tuple[int, ...],
) -> list[ov.Node]:
    """A target's results from its layers' hidden states (the last one after the final norm): logits and greedy ids of
    the `logits_indices` rows, and the taps of `target_layer_ids` concatenated as hidden_states."""
    picked = named(ops.gather(layer_outputs[-1], logits_indices, i64(0)), "logits_rows")  # [R, H]
    logits = lm_head(ctx, weights, picked)  # [R, V]
    outputs = [result(logits, LOGITS), result(greedy_ids(logits), GREEDY_IDS)]
    if target_layer_ids:
        taps = [layer_outputs[t] for t in target_layer_ids]
        hidden = taps[0] if len(taps) == 1 else named(ops.concat(taps, -1), "hidden_states/concat")  # [T, n * H]
        outputs.append(result(hidden, TAPS))
    return outputs

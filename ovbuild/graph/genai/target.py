"""Qwen3 target in GenAI's stateful form: input_ids, attention_mask, position_ids, beam_idx in; logits out.

GenAI converts it to PagedAttention when it loads it, then exposes the hidden states of the layers a DFlash draft
taps, found through the `hidden_states_decoder_layers` rt_info: one [B, S, H] node per layer, by friendly name.

    input_ids [B, S] ─ rows [T] ─ embed ─ layer 0 ─ [B, S, H] tap ─ rows ─ ... ─ norm ─ [B, S, H] tap ─ lm_head ─ logits
"""

from __future__ import annotations

import openvino as ov
import openvino.opset16 as ops

from ovbuild.errors import UnsupportedError
from ovbuild.graph.context import BuildContext
from ovbuild.graph.decoder import decoder_stack, embedding, lm_head
from ovbuild.graph.genai.sdpa import StatefulSDPA
from ovbuild.graph.ops import Output, i64, named, parameter, result
from ovbuild.graph.rope import rotary_tables
from ovbuild.graph.weights import WeightPolicy
from ovbuild.ir import HeadGeometry, TargetIR, WeightStorage, write_rt_info
from ovbuild.ir.ports import ATTENTION_MASK, BEAM_IDX, GENAI_INPUT_IDS, GENAI_POSITION_IDS, LOGITS
from ovbuild.weights.target import TargetConfig
from ovbuild.weights.tensor_names import WeightSource


def build_genai_target(cfg: TargetConfig, weights: WeightSource, policy: WeightPolicy | None = None) -> ov.Model:
    """The stateful SDPA target IR, with a hidden-state locator for every layer (GenAI ignores those not tapped)."""
    check_genai_target(cfg)
    input_ids = parameter(GENAI_INPUT_IDS, [-1, -1])
    attention_mask = parameter(ATTENTION_MASK, [-1, -1])
    position_ids = parameter(GENAI_POSITION_IDS, [-1, -1])
    beam_idx = parameter(BEAM_IDX, [-1])
    batch_seq = named(ops.shape_of(input_ids), "batch_seq")  # [2]: B, S
    attention = StatefulSDPA(batch_seq, attention_mask.output(0), beam_idx=beam_idx.output(0))
    positions = ops.reshape(position_ids, i64([-1]), False).output(0)  # [T]
    ctx = BuildContext(
        cfg, weights, policy or WeightPolicy(), attention, rotary_tables(positions, cfg.rope, cfg.head_dim)
    )

    per_sequence = ops.concat([batch_seq, i64([cfg.hidden_size])], 0)  # B, S, H
    x = embedding(ctx, weights, ops.reshape(input_ids, i64([-1]), False).output(0))  # [T, H]
    locators = {}

    def tap(i: int, y: Output) -> Output:
        """Layer i's output goes on through its [B, S, H] view, the node GenAI reads it from."""
        state = _per_sequence(y, per_sequence, f"layers.{i}/hidden_state")  # [B, S, H]
        locators[i] = state.get_node().get_friendly_name()
        return ops.reshape(state, i64([-1, cfg.hidden_size]), False).output(0)  # [T, H]

    states = decoder_stack(ctx, x, tap)
    h = _per_sequence(states[-1], per_sequence, "norm/hidden_state")  # [B, S, H]: the last layer's, after the norm
    locators[cfg.num_layers - 1] = h.get_node().get_friendly_name()
    logits = lm_head(ctx, weights, h)  # [B, S, V], the MatMul itself feeds the Result (GenAI grafts its weight)
    model = ov.Model(
        [result(logits, LOGITS)],
        attention.sinks,
        [input_ids, attention_mask, position_ids, beam_idx],
        "ovbuild_qwen3_target_genai",
    )
    info = TargetIR(
        heads=HeadGeometry(cfg.num_kv_heads, cfg.head_dim),
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        form="genai",
        hidden_state_locators=locators,
    )
    # The GenAI form has always recorded the weight format alone (optimum's sym / group size are not written).
    write_rt_info(model, info, WeightStorage(ctx.policy.weight_format))
    return model


def check_genai_target(cfg: TargetConfig) -> None:
    """GenAI carries a sliding window through its PagedAttention conversion only for Phi-3 / gpt-oss mask patterns.
    (Which target families have a stateful SDPA form at all is their declaration's business: ovbuild.targets.)"""
    windowed = [i for i, w in enumerate(cfg.sliding_windows) if w]
    if windowed:
        raise UnsupportedError(
            f"target layers {windowed} use a sliding window: OpenVINO GenAI 2026.4's SDPA->PagedAttention conversion "
            "would drop it (it reads windows only from Phi-3 and gpt-oss mask patterns); export the paged form instead"
        )


def _per_sequence(rows: Output, shape: Output, path: str) -> Output:
    return named(ops.reshape(rows, shape, False), path)  # [T, H] -> [B, S, H]

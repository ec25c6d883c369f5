"""DFlash v1 draft in GenAI's stateful form: no embedding, no lm_head; GenAI grafts the target's onto it.

One call = the new context rows (target taps GenAI has not sent before) then the block [seed, mask x N] as
embeddings. The paged draft's trunk (`draft_trunk`: fc, hidden_norm, the layers on the block rows) builds it, with
this form's row layout (`StatefulRows`: one sequence, [context; block]) and attention (`StatefulSDPA`): the context
rows' keys/values are stored in the state, the block's are attended to and dropped.

    hidden_states [1, C, n * Ht] ─ fc ─ hidden_norm ─ context [C, H] ──┬──────── keys/values of context rows
    inputs_embeds [1, Q, H] ─ rows ─ concat [C + Q, H] ─ layers ─ block rows after the seed ─ norm ─ last_hidden_state
"""

from __future__ import annotations

import numpy as np
import openvino as ov
import openvino.opset16 as ops

from ovbuild.errors import UnsupportedError
from ovbuild.graph.context import BuildContext
from ovbuild.graph.decoder import decoder_layer, norm
from ovbuild.graph.dflash import draft_ir, draft_trunk
from ovbuild.graph.genai.sdpa import StatefulSDPA
from ovbuild.graph.ops import Output, const, i64, named, parameter, result
from ovbuild.graph.rope import rotary_tables
from ovbuild.graph.weights import WeightPolicy
from ovbuild.ir import WeightStorage, write_rt_info
from ovbuild.ir.ports import (
    ATTENTION_MASK,
    GENAI_POSITION_IDS,
    GENAI_TAPS_IN,
    INPUTS_EMBEDS,
    LAST_HIDDEN_STATE,
    TOKEN_TYPE_IDS,
)
from ovbuild.weights.draft_config import DraftConfig
from ovbuild.weights.tensor_names import WeightSource

END = np.iinfo(np.int64).max


def build_genai_draft(cfg: DraftConfig, weights: WeightSource, policy: WeightPolicy | None = None) -> ov.Model:
    """The stateful DFlash v1 draft IR GenAI's DFlash pipeline drives (batch 1, one request)."""
    check_genai_draft(cfg)
    h, width = cfg.hidden_size, cfg.num_taps * cfg.target_hidden_size
    inputs_embeds = parameter(INPUTS_EMBEDS, [-1, -1, h])
    hidden_states = parameter(GENAI_TAPS_IN, [-1, -1, width])
    position_ids = parameter(GENAI_POSITION_IDS, [-1, -1])
    attention_mask = parameter(ATTENTION_MASK, [-1, -1])

    taps = ops.reshape(hidden_states, i64([-1, width]), False).output(0)  # [C, n * Ht]
    block = ops.reshape(inputs_embeds, i64([-1, h]), False).output(0)  # [Q, H]
    n_ctx = named(ops.gather(ops.shape_of(taps), i64([0]), i64(0)), "context_rows")  # [1]
    n_block = ops.gather(ops.shape_of(block), i64([0]), i64(0))  # [1]
    batch_seq = ops.concat([i64([1]), ops.add(n_ctx, n_block)], 0).output(0)  # [2]: 1, C + Q
    attention = StatefulSDPA(batch_seq, attention_mask.output(0), committed_rows=n_ctx)
    positions = ops.reshape(position_ids, i64([-1]), False).output(0)  # [C + Q]
    ctx = BuildContext(
        cfg, weights, policy or WeightPolicy(), attention, rotary_tables(positions, cfg.rope, cfg.head_dim)
    )

    x = draft_trunk(ctx, cfg, taps, StatefulRows(n_ctx, n_block), lambda block_rows: block, decoder_layer)  # [Q, H]
    candidates = ops.slice(x, i64([1]), i64([END]), i64([1]), i64([0]))  # [Q - 1, H]: seed dropped
    out = ops.unsqueeze(norm(ctx, candidates, "norm"), i64([0]))  # [1, Q - 1, H]
    params = [inputs_embeds, hidden_states, position_ids, attention_mask]
    model = ov.Model([result(out, LAST_HIDDEN_STATE)], attention.sinks, params, f"ovbuild_{cfg.family}_draft_genai")
    # The GenAI form has always recorded the weight format alone (optimum's sym / group size are not written).
    write_rt_info(model, draft_ir(cfg, form="genai"), WeightStorage(ctx.policy.weight_format))
    return model


class StatefulRows:
    """One sequence per call, packed [C context rows ; Q block rows]; context features exist for context rows only."""

    def __init__(self, n_ctx: Output, n_block: Output):
        self.n_ctx, self.n_block = n_ctx, n_block  # [1], [1]

    def split(self) -> tuple[Output, Output]:
        context = ops.broadcast(const(0, np.int32), self.n_ctx)  # [C]
        block = ops.broadcast(const(1, np.int32), self.n_block)  # [Q]
        token_type_ids = named(ops.concat([context, block], 0), TOKEN_TYPE_IDS)  # [C + Q]
        first, end = ops.squeeze(self.n_ctx, i64(0)), ops.squeeze(ops.add(self.n_ctx, self.n_block), i64(0))  # [], []
        block_rows = named(ops.range(first, end, i64(1), ov.Type.i64), "block_rows")  # [Q]: C .. C + Q - 1
        return token_type_ids, block_rows  # [C + Q], [Q]

    def kv_input(self, context: Output, block_rows: Output, u: Output) -> Output:
        """The context features followed by the block rows' state: [C + Q, H]."""
        return named(ops.concat([context, u], 0), f"{u.get_node().get_friendly_name()}/kv_input")


def check_genai_draft(cfg: DraftConfig) -> None:
    """GenAI's DFlash pipeline grafts the bare target embedding and lm_head: nothing may sit between them and us."""
    if cfg.candidate_offset != 1:
        raise UnsupportedError(
            f"GenAI reads candidates from block row 1 on; this draft starts at {cfg.candidate_offset}"
        )
    transforms = {
        "input_embedding_scale": cfg.input_embedding_scale != 1.0,
        "output_multiplier": cfg.output_multiplier != 1.0,
        "final_logit_softcapping": bool(cfg.final_logit_softcapping),
    }
    if any(transforms.values()):
        names = ", ".join(k for k, on in transforms.items() if on)
        raise UnsupportedError(f"{names}: GenAI grafts the plain target embedding / lm_head, which would skip them")

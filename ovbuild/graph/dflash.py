"""Paged DFlash v1 draft, per-row layout; also the backbone of DSpark / DeepSpec drafts (candidate offset 0).

Each sequence contributes its new context rows (target taps, token_type_ids = 0) then its block rows
([anchor, mask x (B-1)], token_type_ids = 1). In every layer a row's key/value input is the context feature for a
context row and the normalized block state for a block row; PagedAttention's token_type_ids makes each block
bidirectional while context stays causal. All rows are written to the cache; the runtime rolls the block back by
passing the committed length as past_lens next time.

    hidden_states ─ fc ─ hidden_norm ─ C ──┐ (context rows)
    input_ids ─ embed (* scale) ─ x ─ layers(kv_input = C | u) ─ gather(candidate_indices) ─ norm ─ lm_head ─ logits

`draft_trunk` (fc, hidden_norm, the layers on the block rows) is shared with every other IR form of the draft: a form
supplies its row layout (`DraftRows`: `PagedRows` here, `graph.genai.draft.StatefulRows` for GenAI), its attention
backend (BuildContext.attention) and what comes before the first layer and after the last.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import openvino as ov
import openvino.opset16 as ops

from ovbuild.graph.context import BuildContext
from ovbuild.graph.decoder import decoder_layer, embedding, greedy_ids, lm_head, norm
from ovbuild.graph.ops import Output, const, i32, i64, named, parameter, result
from ovbuild.graph.paged_attention import PagedInputs
from ovbuild.graph.rope import rotary_tables
from ovbuild.graph.weights import WeightPolicy
from ovbuild.ir import DraftIR, HeadGeometry, write_rt_info
from ovbuild.ir.ports import (
    CANDIDATE_INDICES,
    GREEDY_IDS,
    INPUT_IDS,
    LAST_HIDDEN_STATE,
    LOGITS,
    POSITION_IDS,
    SUBSEQUENCE_BEGINS,
    TAPS_IN,
    TOKEN_TYPE_IDS,
)
from ovbuild.weights.draft_config import DraftConfig
from ovbuild.weights.tensor_names import WeightSource


def build_dflash_draft(
    cfg: DraftConfig,
    draft: WeightSource,
    target: WeightSource,
    policy: WeightPolicy | None = None,
    layer=decoder_layer,
    markov_head: str | None = None,
) -> ov.Model:
    """The paged draft IR; embedding and lm_head come from the draft when it carries them, else from `target`.

    `layer(ctx, i, x, kv_input, token_type_ids)` builds one layer on the block rows x [Tb, H] (kv_input(u) gives the
    [T, H] key/value source of every packed row): families that wrap the Qwen3 layer pass theirs. `markov_head`: the
    file stem of the head IR the backbone needs, recorded in its rt_info.
    """
    input_ids = parameter(INPUT_IDS, [-1])
    hidden_states = parameter(TAPS_IN, [-1, cfg.num_taps * cfg.target_hidden_size])
    token_type_ids = parameter(TOKEN_TYPE_IDS, [-1])
    position_ids = parameter(POSITION_IDS, [-1])
    candidate_indices = parameter(CANDIDATE_INDICES, [-1])
    paged = PagedInputs(bidirectional_rows=cfg.block_size)  # each block is one bidirectional run
    ctx = BuildContext(
        cfg, draft, policy or WeightPolicy(), paged, rotary_tables(position_ids.output(0), cfg.rope, cfg.head_dim)
    )
    ctx.inputs.update(
        token_type_ids=token_type_ids.output(0), subsequence_begins=paged.sequence[SUBSEQUENCE_BEGINS].output(0)
    )

    rows = PagedRows(token_type_ids.output(0))

    def embed(block_rows: Output) -> Output:
        block_ids = named(ops.gather(input_ids, block_rows, i64(0)), "block_ids")  # [Tb]
        x = embedding(ctx, owner(draft, target, "embed_tokens"), block_ids)  # [Tb, H]
        if cfg.input_embedding_scale != 1.0:
            x = named(ops.multiply(x, const(cfg.input_embedding_scale)), "embed_tokens/scale")
        return x

    x = draft_trunk(ctx, cfg, hidden_states.output(0), rows, embed, layer)  # [Tb, H]
    # candidate_indices count packed rows; a block row's place among block rows is the block rows up to it, minus one
    block_slot = ops.subtract(ops.cumsum(ops.convert(rows.is_block, ov.Type.i64), i64(0)), i64(1))  # [T]
    picked = named(ops.gather(x, ops.gather(block_slot, candidate_indices, i64(0)), i64(0)), "candidate_rows")  # [R, H]
    h = norm(ctx, picked, "norm")  # [R, H]
    logits = logit_transforms(cfg, lm_head(ctx, owner(draft, target, "lm_head"), h))
    params = [input_ids, hidden_states, token_type_ids, position_ids, *paged.parameters, candidate_indices]
    outputs = [result(logits, LOGITS), result(greedy_ids(logits), GREEDY_IDS), result(h, LAST_HIDDEN_STATE)]
    model = ov.Model(outputs, params, f"ovbuild_{cfg.family}_draft")
    write_rt_info(model, draft_ir(cfg, markov_head=markov_head), ctx.policy.storage())  # and how weights are stored
    return model


def logit_transforms(cfg: DraftConfig, logits: Output) -> Output:
    """output_multiplier, then cap * tanh(logits / cap) when final_logit_softcapping > 0."""
    if cfg.output_multiplier != 1.0:
        logits = named(ops.multiply(logits, const(cfg.output_multiplier)), "logits/output_multiplier")
    cap = cfg.final_logit_softcapping
    if cap:
        logits = named(ops.multiply(ops.tanh(ops.divide(logits, const(cap))), const(cap)), "logits/softcap")
    return logits


class DraftRows(Protocol):
    """Where a draft call's rows sit on the attention's packed axis: the input layout of one IR form."""

    def split(self) -> tuple[Output, Output]:
        """(token_type_ids [T] i32: 0 context row, 1 block row; the block rows [Tb] i64), built once per graph."""

    def kv_input(self, context: Output, block_rows: Output, u: Output) -> Output:
        """Every row's key/value source [T, H]: context features [C, H] on context rows, the block rows' state u
        [Tb, H] on block rows."""


class PagedRows:
    """Packed rows of many sequences, each [its new context rows ; its block]: the caller's token_type_ids says which
    row is which, and context features exist for every row (zero on block rows)."""

    def __init__(self, token_type_ids: Output):
        self.token_type_ids = token_type_ids
        self.is_block: Output | None = None  # [T] bool, built by `split` (the candidate rows are counted on it)

    def split(self) -> tuple[Output, Output]:
        self.is_block = ops.equal(self.token_type_ids, i32(1))  # [T]
        block_rows = named(ops.squeeze(ops.non_zero(self.is_block, "i64"), i64([0])), "block_rows")  # [1, Tb] -> [Tb]
        return self.token_type_ids, block_rows

    def kv_input(self, context: Output, block_rows: Output, u: Output) -> Output:
        """The context feature of every row [T, H], with the block rows' state written in."""
        return named(ops.scatter_update(context, block_rows, u, i64(0)), f"{u.get_node().get_friendly_name()}/kv_input")


def draft_trunk(
    ctx: BuildContext, cfg: DraftConfig, taps: Output, rows: DraftRows, embed: Callable[[Output], Output], layer
) -> Output:
    """The DFlash draft between its inputs and its head, for any IR form: fc + hidden_norm on the target taps [C, n *
    Ht], then the layers on the block rows, whose input `embed(block_rows)` gives [Tb, H]. Returns the block rows'
    stream [Tb, H] after the last layer.

    The residual stream lives on the block rows only: context rows feed keys and values, nothing reads the rest.
    """
    context = norm(ctx, ctx.linear(taps, "fc", cfg.hidden_size, cfg.num_taps * cfg.target_hidden_size), "hidden_norm")
    token_type_ids, block_rows = rows.split()
    ctx.queries_on(block_rows)
    x = embed(block_rows)  # [Tb, H]
    for i in range(cfg.num_layers):
        tt = None if cfg.layer_causal[i] else token_type_ids
        x = layer(ctx, i, x, lambda u: rows.kv_input(context, block_rows, u), tt)
    return x


def draft_ir(cfg: DraftConfig, form: str = "paged", markov_head: str | None = None) -> DraftIR:
    """What a draft IR of this config records: the DFlash keys as GenAI names them, plus ovbuild's own."""
    return DraftIR(
        family=cfg.family,
        heads=HeadGeometry(cfg.num_kv_heads, cfg.head_dim),
        block_size=cfg.block_size,
        mask_token_id=cfg.mask_token_id,
        target_layer_ids=tuple(cfg.target_layer_ids),
        candidate_offset=cfg.candidate_offset,
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        target_hidden_size=cfg.target_hidden_size,
        form=form,
        markov_head=markov_head,
    )


def owner(draft: WeightSource, target: WeightSource, name: str) -> WeightSource:
    """Drafts borrow the target's embedding and lm_head unless they carry their own (DSpark checkpoints do)."""
    return draft if draft.has(name) else target


def build_dflash_models(
    cfg: DraftConfig, draft: WeightSource, target: WeightSource, policy: WeightPolicy
) -> dict[str, ov.Model]:
    """The one IR of a DFlash v1 draft folder, keyed by file stem."""
    return {"openvino_model": build_dflash_draft(cfg, draft, target, policy)}

"""Paged DFlash v2 draft (the v1 per-row backbone with two grouped dynamic convolutions per layer) and its Markov head.

v2 layer, on packed rows (the convolutions never reach past the block of the row they produce):

    x ─ input_layernorm ─ u ─ attention_conv.prepare ─ a ─ attention(q, block k/v from a) ─ attention_conv.finish ─ (+x)
      ─ post_attention_layernorm ─ u2 ─ mlp_conv.prepare ─ mlp ─ mlp_conv.finish ─ (+)

The Markov head `openvino_markov_head_model` is the candidate selector as a packed Top-K lattice: transitions
<predecessor_codebook[a] * (hidden_projection h), successor_codebook[b]>, gated by the draft hidden state h.
"""

from __future__ import annotations

import openvino as ov
import openvino.opset16 as ops

from ovbuild.graph.context import BuildContext
from ovbuild.graph.conv import GroupedDynamicConv, block_row_index, tap_masks
from ovbuild.graph.decoder import mlp, norm, self_attention
from ovbuild.graph.dflash import build_dflash_draft
from ovbuild.graph.lattice import packed_topk_lattice
from ovbuild.graph.ops import Output, i64, named, parameter, result
from ovbuild.graph.weights import WeightPolicy
from ovbuild.ir import MARKOV_HEAD_STEM, MODEL_STEM, DFlash2Keys, MarkovHeadIR, write_rt_info
from ovbuild.ir.ports import (
    CANDIDATE_BEGINS,
    CANDIDATE_IDS,
    DRAFT_HIDDEN_STATES,
    EDGE_SCORES,
    HEAD_LOGITS,
    PREV_TOKEN_IDS,
    SUBSEQUENCE_BEGINS,
    TOKEN_TYPE_IDS,
)
from ovbuild.weights.families.dflash2 import DFlash2Config
from ovbuild.weights.tensor_names import WeightSource


class DFlash2Layer:
    """The v2 decoder layer for `build_dflash_draft`; the per-row tap masks are built once per graph."""

    def __init__(self, cfg: DFlash2Config):
        self.cfg = cfg
        self.masks: list[Output] | None = None

    def __call__(self, ctx: BuildContext, i: int, x: Output, kv_input, token_type_ids: Output | None = None) -> Output:
        cfg = self.cfg
        if self.masks is None:
            index = block_row_index(ctx.inputs[TOKEN_TYPE_IDS], ctx.inputs[SUBSEQUENCE_BEGINS])  # [T]
            index = ops.gather(index, ctx.query_rows, i64(0))  # [Tb]: x holds the block rows only
            self.masks = tap_masks(index, cfg.conv_kernel_size)

        def conv(name: str, u: Output) -> GroupedDynamicConv:
            k, group = cfg.conv_kernel_size, cfg.conv_group_size
            return GroupedDynamicConv(ctx, f"layers.{i}.{name}", u, self.masks, k, group)

        u = norm(ctx, x, f"layers.{i}.input_layernorm")
        attention_conv = conv("attention_conv", u)
        a = attention_conv.prepare(u)  # block rows' queries, keys and values come from the convolved input
        attn = self_attention(ctx, i, a, kv_input(a), token_type_ids)
        x = named(ops.add(x, attention_conv.finish(attn)), f"layers.{i}/attn_residual")
        u2 = norm(ctx, x, f"layers.{i}.post_attention_layernorm")
        mlp_conv = conv("mlp_conv", u2)
        m = mlp(ctx, i, mlp_conv.prepare(u2))
        return named(ops.add(x, mlp_conv.finish(m)), f"layers.{i}/output")


def build_dflash2_draft(
    cfg: DFlash2Config, draft: WeightSource, target: WeightSource, policy: WeightPolicy | None = None
) -> ov.Model:
    """The paged v2 backbone IR: the v1 inputs and outputs (`logits` carry the logit transforms)."""
    model = build_dflash_draft(cfg, draft, target, policy, layer=DFlash2Layer(cfg), markov_head=MARKOV_HEAD_STEM)
    keys = DFlash2Keys(
        top_k=cfg.selector_top_k,
        selector_rank=cfg.selector_rank,
        conv_kernel_size=cfg.conv_kernel_size,
        conv_group_size=cfg.conv_group_size,
        input_embedding_scale=cfg.input_embedding_scale,
        output_multiplier=cfg.output_multiplier,
        final_logit_softcapping=cfg.final_logit_softcapping,
    )
    write_rt_info(model, keys)
    return model


def build_markov_head(cfg: DFlash2Config, draft: WeightSource, policy: WeightPolicy | None = None) -> ov.Model:
    """The selector as a packed Top-K lattice; never integer-compressed, checkpoint precision unless asked otherwise.

    Inputs: logits [R, V] f32 (candidate rows, transforms applied), draft_hidden_states [R, H] f32, prev_token_ids [S]
    i64 (each sequence's anchor), candidate_begins [S+1] i32. Outputs: candidate_ids [R, K] i64, edge_scores
    [R, K, K] f32 (edge_scores[r, a, b]: unary logit of candidate b plus the transition from predecessor a).
    """
    policy = (policy or WeightPolicy()).uncompressed()
    h, v, rank = cfg.hidden_size, cfg.vocab_size, cfg.selector_rank
    logits = parameter(HEAD_LOGITS, [-1, v])
    hidden = parameter(DRAFT_HIDDEN_STATES, [-1, h])
    prev_token_ids = parameter(PREV_TOKEN_IDS, [-1])
    candidate_begins = parameter(CANDIDATE_BEGINS, [-1])

    def weight(name: str, shape: tuple[int, int], role: str) -> Output:
        p = f"candidate_selector.{name}"
        return policy.matrix(draft.get(p, shape), p.replace(".", "/"), role=role)

    projection = weight("hidden_projection", (rank, h), "linear")
    predecessor_codebook = weight("predecessor_codebook", (v, rank), "embedding")
    successor_codebook = weight("successor_codebook", (v, rank), "embedding")
    gate = ops.matmul(hidden, projection, False, True)  # [R, r]: the hidden state's gate in rank space
    gate = named(ops.unsqueeze(gate, i64(1)), "candidate_selector/gate")  # [R, 1, r]

    def transition(predecessors: Output, candidates: Output) -> tuple[Output, Output]:
        pred = ops.multiply(ops.gather(predecessor_codebook, predecessors, i64(0)), gate)  # [R, K, r]
        cand = ops.gather(successor_codebook, candidates, i64(0))  # [R, K, r]
        return named(pred, "candidate_selector/predecessors"), named(cand, "candidate_selector/successors")

    lattice = packed_topk_lattice(
        logits.output(0), prev_token_ids.output(0), candidate_begins.output(0), cfg.selector_top_k, transition
    )
    model = ov.Model(
        [result(lattice.candidate_ids, CANDIDATE_IDS), result(lattice.edge_scores, EDGE_SCORES)],
        [logits, hidden, prev_token_ids, candidate_begins],
        "ovbuild_dflash2_markov_head",
    )
    info = MarkovHeadIR(
        family=cfg.family,
        head_type="dflash2",
        rank=rank,
        vocab_size=v,
        hidden_size=h,
        top_k=cfg.selector_top_k,
        version=2,
    )
    write_rt_info(model, info, policy.storage())  # the head's own storage: never integer-compressed
    return model


def build_dflash2_models(
    cfg: DFlash2Config, draft: WeightSource, target: WeightSource, policy: WeightPolicy
) -> dict[str, ov.Model]:
    """Both IRs of a v2 draft folder, keyed by file stem."""
    return {
        MODEL_STEM: build_dflash2_draft(cfg, draft, target, policy),
        MARKOV_HEAD_STEM: build_markov_head(cfg, draft, policy),
    }

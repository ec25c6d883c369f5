"""DSpark / DeepSpec DFlash drafts: the DFlash v1 backbone with candidate offset 0, and the Markov head IR.

The Markov head `openvino_markov_head_model` holds the exact greedy chain: the authors' sequential head unrolled over
the block rows, all sequences at once. Row k of every sequence adds the full-vocabulary bias of the token chosen on
row k-1 (the anchor, `prev_token_ids`, for row 0) and takes the argmax:

    prev_token_ids ─ W1 ─ e ─(gated: * sigmoid(gate_proj [h_k ; e]))─ W2 ─ + logits[row k] ─ argmax ─ x_k ─┐
          └──────────────────────────── x_k is the next row's previous token ─────────────────────────────┘

The confidence head (when it reads the Markov features) sits in the same IR and scores each row with the token the
chain chose before it; a confidence head on the hidden state alone is an output of the backbone IR. The head IR is
never integer-compressed. `build_dspark_models` builds a draft folder's IRs: the backbone and a head holding the
chain and the Top-K lattice form of the same head (`ovbuild.graph.dspark_lattice`).
"""

from __future__ import annotations

import numpy as np
import openvino as ov
import openvino.opset16 as ops

from ovbuild.errors import ConfigError
from ovbuild.graph.dflash import build_dflash_draft
from ovbuild.graph.dspark_lattice import DEFAULT_TOP_K, markov_lattice
from ovbuild.graph.markov_head import MarkovHead, last_row
from ovbuild.graph.ops import Output, argmax, i64, named, result
from ovbuild.graph.weights import WeightPolicy, f32_constant
from ovbuild.ir import MARKOV_HEAD_STEM as MARKOV_HEAD  # the name the tests and older callers import
from ovbuild.ir import MODEL_STEM, DSparkKeys, MarkovHeadIR, write_rt_info
from ovbuild.ir.ports import (
    CHAIN_IDS,
    CONFIDENCE,
    LAST_HIDDEN_STATE,
)
from ovbuild.weights.families.dspark import DSparkConfig
from ovbuild.weights.tensor_names import WeightSource


def greedy_chain(head: MarkovHead, steps: int) -> dict[str, Output]:
    """The sequential head unrolled over `steps` rows: chain_ids [R] i64 (and confidence [R] f32).

    Step k works on row candidate_begins[s] + k of every sequence s; rows a sequence does not have are computed on a
    clamped row and their results are written to a discarded slot R.
    """
    logits = head.logits.output(0)
    begins = ops.convert(head.candidate_begins, ov.Type.i64)
    firsts = ops.slice(begins, i64([0]), i64([-1]), i64([1]))  # [S]
    counts = ops.subtract(ops.slice(begins, i64([1]), i64([np.iinfo(np.int64).max]), i64([1])), firsts)  # [S]
    num_rows = ops.gather(ops.shape_of(logits, ov.Type.i64), i64([0]), i64(0))  # [1]
    last = last_row(logits)
    previous = head.prev_token_ids.output(0)
    slots, tokens, confidences = [], [], []
    for k in range(steps):
        p = f"markov_chain/row{k}"
        rows = ops.add(firsts, i64([k]))  # [S]
        clamped = ops.minimum(rows, last)
        h = ops.gather(head.hidden, clamped, i64(0)) if head.hidden is not None else None  # [S, H]
        e = head.embed(previous, f"{p}/markov_w1")  # [S, r]
        if head.with_confidence:
            confidences.append(head.confidence(h, e, f"{p}/confidence"))
        scores = ops.add(ops.gather(logits, clamped, i64(0)), head.bias(head.gate(e, h, f"{p}/gate"), f"{p}/bias"))
        previous = argmax(scores, f"{p}/token")  # [S]
        tokens.append(previous)
        slots.append(ops.select(ops.less(i64([k]), counts), rows, num_rows))  # [S]: a row of its own, or slot R
    slots = named(ops.concat(slots, 0), "markov_chain/slots")  # [steps * S]
    outputs = {CHAIN_IDS: scatter_rows(ops.concat(tokens, 0), slots, num_rows, ov.Type.i64, CHAIN_IDS)}
    if head.with_confidence:
        outputs[CONFIDENCE] = scatter_rows(ops.concat(confidences, 0), slots, num_rows, ov.Type.f32, CONFIDENCE)
    return outputs


def scatter_rows(values: Output, slots: Output, num_rows: Output, dtype: ov.Type, path: str) -> Output:
    """values [N] written at slots [N] (each a row in [0, R) or the discarded slot R) -> [R]."""
    zeros = ops.broadcast(ops.convert(i64(0), dtype), ops.add(num_rows, i64([1])))  # [R + 1]
    filled = ops.scatter_update(zeros, slots, values, i64(0))  # [R + 1]
    return named(ops.slice(filled, i64([0]), num_rows, i64([1])), f"markov_chain/{path}")  # [R]


def markov_head_model(
    head: MarkovHead, outputs: dict[str, Output], modes: list[str], top_k: int | None = None
) -> ov.Model:
    """The head IR from its outputs; rt_info says which forms it holds (chain and/or lattice, of `top_k`)."""
    cfg = head.cfg
    model = ov.Model([result(v, k) for k, v in outputs.items()], head.parameters, "ovbuild_dspark_markov_head")
    info = MarkovHeadIR(
        family=cfg.family,
        head_type=cfg.markov_head_type,
        rank=cfg.markov_rank,
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        modes=tuple(modes),
        top_k=top_k,
        block_size=cfg.block_size,
    )
    write_rt_info(model, info, head.policy.storage())  # the head's own storage: never integer-compressed
    return model


def build_markov_head(cfg: DSparkConfig, draft: WeightSource, policy: WeightPolicy | None = None) -> ov.Model:
    """The exact greedy chain IR (outputs chain_ids [R] i64, and confidence [R] f32 with a Markov confidence head)."""
    head = MarkovHead(cfg, draft, policy or WeightPolicy())
    return markov_head_model(head, greedy_chain(head, cfg.block_size), ["chain"])


def build_dspark_draft(
    cfg: DSparkConfig, draft: WeightSource, target: WeightSource, policy: WeightPolicy | None = None
) -> ov.Model:
    """The backbone IR: a DFlash v1 per-row draft with candidate offset 0 (plus `confidence` [R] when the confidence
    head reads the hidden state alone)."""
    policy = policy or WeightPolicy()
    model = build_dflash_draft(cfg, draft, target, policy, markov_head=MARKOV_HEAD if cfg.markov_rank else None)
    if cfg.enable_confidence_head and not cfg.confidence_head_with_markov:
        h = model.output(LAST_HIDDEN_STATE).get_node().input_value(0)  # [R, H]: what the Result reads
        model.add_results([result(hidden_confidence(cfg, draft, policy, h), CONFIDENCE)])
    write_rt_info(model, DSparkKeys(cfg.markov_rank, cfg.markov_head_type if cfg.markov_rank else None))
    return model


def hidden_confidence(cfg: DSparkConfig, draft: WeightSource, policy: WeightPolicy, h: Output) -> Output:
    """sigmoid(w . h + b) of every candidate row: h [R, H] -> [R]."""
    w = policy.uncompressed().matrix(draft.get("confidence_head.proj", (1, cfg.hidden_size)), "confidence_head/proj")
    b = f32_constant(draft.get("confidence_head.proj.bias", (1,)), "confidence_head/bias")
    logit = ops.add(ops.matmul(h, w, False, True), b)  # [R, 1]
    return named(ops.squeeze(ops.sigmoid(logit), i64([-1])), "confidence_head/confidence")


def build_lattice_markov_head(
    cfg: DSparkConfig,
    draft: WeightSource,
    policy: WeightPolicy | None = None,
    top_k: int = DEFAULT_TOP_K,
    with_chain: bool = True,
) -> ov.Model:
    """The Markov head IR holding the lattice (and, by default, the exact chain next to it)."""
    if not 1 <= top_k <= cfg.vocab_size:
        raise ConfigError(f"lattice top_k = {top_k} must lie in [1, vocab_size = {cfg.vocab_size}]")
    head = MarkovHead(cfg, draft, policy or WeightPolicy())
    outputs = greedy_chain(head, cfg.block_size) if with_chain else {}
    outputs.update(markov_lattice(head, top_k))
    modes = ["chain", "lattice"] if with_chain else ["lattice"]
    return markov_head_model(head, outputs, modes, top_k)


def build_dspark_models(
    cfg: DSparkConfig, draft: WeightSource, target: WeightSource, policy: WeightPolicy
) -> dict[str, ov.Model]:
    """Every IR of a DSpark draft folder by file stem: the backbone and a head holding both the exact chain (the
    greedy default) and the Top-K lattice; a DeepSpec DFlash draft (markov_rank 0) has no head file."""
    models = {MODEL_STEM: build_dspark_draft(cfg, draft, target, policy)}
    if cfg.markov_rank:
        models[MARKOV_HEAD] = build_lattice_markov_head(cfg, draft, policy)
    return models

"""The DSpark Markov head as a packed Top-K lattice (vanilla and gated), with the dense first step.

Each sequence's first row knows its predecessor (the anchor), so its bias W2 g(W1[anchor]) is added over the whole
vocabulary before Top-K; later rows score the transitions from the previous row's K candidates:
    edge[r, a, b] = logits[r, C_r[b]] + <g(h_r, W1[P_r[a]]), W2[C_r[b]]>,   g = identity (vanilla) or the gate.
The exact head picks tokens outside the unary Top-K often, so the lattice approximates it; the chain
(`ovbuild.graph.dspark`) is the exact greedy form and sits in the same IR (`build_lattice_markov_head` there).
"""

from __future__ import annotations

import openvino.opset16 as ops

from ovbuild.graph.lattice import packed_topk_lattice
from ovbuild.graph.markov_head import MarkovHead
from ovbuild.graph.ops import Output, i64, named
from ovbuild.ir.ports import CANDIDATE_IDS, EDGE_SCORES, PREDECESSOR_CONFIDENCE

DEFAULT_TOP_K = 8


def markov_lattice(head: MarkovHead, top_k: int) -> dict[str, Output]:
    """candidate_ids [R, K] i64, edge_scores [R, K, K] f32, and with a Markov confidence head
    predecessor_confidence [R, K] f32: the confidence of row r when its predecessor is the a-th one."""
    hidden = head.hidden.output(0) if head.hidden is not None else None
    row_hidden = named(ops.unsqueeze(hidden, i64(1)), "markov_lattice/row_hidden") if hidden is not None else None
    predecessor_vectors: list[Output] = []

    def transition(predecessors: Output, candidates: Output) -> tuple[Output, Output]:
        e = head.embed(predecessors, "markov_lattice/markov_w1")  # [R, K, r]
        predecessor_vectors.append(e)
        pred = head.gate(e, row_hidden, "markov_lattice/gate")  # [R, K, r]
        cand = named(ops.gather(head.w2, candidates, i64(0)), "markov_lattice/markov_w2")  # [R, K, r]
        return pred, cand

    def first_row_bias(prev_token_ids: Output) -> Output:
        first_hidden = ops.gather(hidden, head.first_rows(), i64(0)) if hidden is not None else None  # [S, H]
        e = head.embed(prev_token_ids, "markov_lattice/first_row/markov_w1")  # [S, r]
        return head.bias(head.gate(e, first_hidden, "markov_lattice/first_row/gate"), "markov_lattice/first_row/bias")

    lattice = packed_topk_lattice(
        head.logits.output(0),
        head.prev_token_ids.output(0),
        head.candidate_begins.output(0),
        top_k,
        transition,
        first_row_bias,
    )
    outputs = {CANDIDATE_IDS: lattice.candidate_ids, EDGE_SCORES: lattice.edge_scores}
    if head.with_confidence:
        (e,) = predecessor_vectors
        outputs[PREDECESSOR_CONFIDENCE] = head.confidence(row_hidden, e, "markov_lattice/predecessor_confidence")
    return outputs

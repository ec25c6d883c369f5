"""The packed Top-K lattice of Markov / selector heads (DFlash v2 selector, DSpark Markov heads).

Rows are the candidate rows of several sequences, delimited by `candidate_begins` [S+1]. Per row r:
    candidates C_r = TopK(unary_r, K)                              (ids, scores sorted by value)
    predecessors P_r = [prev_token_ids[s]] * K on the first row of sequence s, else C_{r-1}
    edge[r, a, b] = unary_r[C_r[b]] + <pred_vec(P_r[a]), cand_vec(C_r[b])>
where the head supplies the transition as rank-space vectors (pred_vec, cand_vec). A head whose first-row transition
is known densely (DSpark: the anchor is fixed) passes `first_row_bias`, added to the full-vocabulary unary scores of
each sequence's first row before TopK; that row then gets no lattice transition (the bias already is its transition).

    unary ─(+ first-row bias)─ TopK ─┬─ ids ─┬──────────────── cand_vec ─┐
    prev_token_ids ─ per row ─ select(first row, anchor, ids of row r-1) ─ pred_vec ─ batched matmul ─ + scores ─ edges
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import openvino as ov
import openvino.opset16 as ops

from ovbuild.graph.ops import Output, i64, named
from ovbuild.graph.packed import row_numbers, row_sequences, shift_rows

# (predecessor ids [R, K] i64, candidate ids [R, K] i64) -> (predecessor vectors [R, K, r], candidate vectors [R, K, r])
Transition = Callable[[Output, Output], tuple[Output, Output]]


@dataclass(frozen=True)
class Lattice:
    candidate_ids: Output  # [R, K] i64
    edge_scores: Output  # [R, K, K] f32: [row, predecessor a, candidate b]


def packed_topk_lattice(
    unary: Output,
    prev_token_ids: Output,
    candidate_begins: Output,
    top_k: int,
    transition: Transition,
    first_row_bias: Callable[[Output], Output] | None = None,
) -> Lattice:
    """unary [R, V] f32, prev_token_ids [S] i64, candidate_begins [S+1] i32 -> the lattice of every row.

    first_row_bias(prev_token_ids [S]) -> [S, V]: optional dense bias of each sequence's first row.
    """
    rows = row_numbers(unary, "lattice/rows")
    sequence = row_sequences(candidate_begins, rows, "lattice/row_sequence")  # [R]
    is_first = ops.equal(rows, ops.gather(candidate_begins, sequence, i64(0)))  # [R]
    is_first = named(ops.unsqueeze(is_first, i64(1)), "lattice/is_first_row")  # [R, 1]
    if first_row_bias is not None:
        bias = ops.gather(first_row_bias(prev_token_ids), sequence, i64(0))  # [R, V]
        unary = named(ops.select(is_first, ops.add(unary, bias), unary), "lattice/first_row_bias")
    # Not stable: equal logits may list their candidates in either order, which only changes what the draft proposes,
    # never the output, while a stable TopK costs 10x (27 vs 2.6 ms for K=8 on [8, 151936] on CPU, bench_topk.py,
    # docs/speed.md).
    top = ops.topk(unary, i64(top_k), -1, "max", "value", index_element_type="i64", name="lattice/topk")
    scores, ids = top.output(0), top.output(1)  # [R, K] each
    anchors = named(ops.unsqueeze(ops.gather(prev_token_ids, sequence, i64(0)), i64(1)), "lattice/anchors")  # [R, 1]
    previous = shift_rows(ids, 1, "lattice/previous_ids")  # [R, K]: candidates of row r - 1
    predecessors = named(ops.select(is_first, anchors, previous), "lattice/pred_ids")  # [R, K]
    pred_vectors, cand_vectors = transition(predecessors, ids)  # [R, K, r] each
    transitions = ops.matmul(pred_vectors, cand_vectors, False, True)  # [R, K, K]
    if first_row_bias is not None:
        later = ops.convert(ops.logical_not(is_first), ov.Type.f32)  # [R, 1]
        transitions = ops.multiply(transitions, ops.unsqueeze(later, i64(2)))  # [R, K, K]
    edges = ops.add(ops.unsqueeze(scores, i64(1)), named(transitions, "lattice/transitions"))  # [R, K, K]
    return Lattice(ids, named(edges, "lattice/edge_scores"))

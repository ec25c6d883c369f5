"""The packed Top-K lattice graph core (with a toy DSpark-like head) and the runtime's greedy walk."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import openvino as ov
import openvino.opset16 as ops
import pytest
from openvino import opset16

from ovbuild.graph.lattice import packed_topk_lattice
from ovbuild.graph.ops import i64, result
from ovbuild.ir import core
from ovbuild.reference.dflash2 import greedy_walk as reference_walk
from ovbuild.runtime.speculation.lattice import greedy_walk
from ovbuild.testing import F32_NMSE, nmse


def bare_input(name: str, shape: list[int], dtype: ov.Type) -> ov.Node:
    """An input of a test subgraph (not an IR port): its tensor named as its friendly name."""
    p = opset16.parameter(shape, dtype, name=name)
    p.output(0).set_names({name})
    return p


VOCAB, RANK, TOP_K = 50, 4, 5
COUNTS = [0, 3, 1, 0, 4, 2]  # candidate rows per sequence: empty sequences first, in the middle and next to others


def begins_of(counts) -> np.ndarray:
    return np.cumsum([0, *counts]).astype(np.int32)


def toy_head(w1: np.ndarray, w2: np.ndarray, dense_first_row: bool) -> ov.CompiledModel:
    """Vanilla Markov transition <W1[pred], W2[cand]>; with dense_first_row, W2 W1[anchor] is added over the vocab."""
    unary = bare_input("logits", [-1, VOCAB], ov.Type.f32)
    prev = bare_input("prev_token_ids", [-1], ov.Type.i64)
    begins = bare_input("candidate_begins", [-1], ov.Type.i32)
    c1, c2 = ops.constant(w1), ops.constant(w2)

    def transition(pred, cand):
        return ops.gather(c1, pred, i64(0)).output(0), ops.gather(c2, cand, i64(0)).output(0)

    def first_row_bias(prev_ids):
        return ops.matmul(ops.gather(c1, prev_ids, i64(0)), c2, False, True).output(0)  # [S, V]

    lattice = packed_topk_lattice(
        unary.output(0),
        prev.output(0),
        begins.output(0),
        TOP_K,
        transition,
        first_row_bias if dense_first_row else None,
    )
    model = ov.Model(
        [result(lattice.candidate_ids, "candidate_ids"), result(lattice.edge_scores, "edge_scores")],
        [unary, prev, begins],
        "toy_head",
    )
    return core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})


def expected_lattice(unary, anchor, w1, w2, dense_first_row):
    """One sequence, written from the formula: TopK per row, anchor then previous row's candidates as predecessors."""
    cand, edges = [], []
    for j, row in enumerate(unary.astype(np.float64)):
        if j == 0 and dense_first_row:
            row = row + w2 @ w1[anchor]
        c = np.argsort(-row, kind="stable")[:TOP_K]
        pred = np.full(TOP_K, anchor) if j == 0 else cand[-1]
        transition = np.zeros((TOP_K, TOP_K)) if j == 0 and dense_first_row else w1[pred] @ w2[c].T
        cand.append(c)
        edges.append(row[c][None, :] + transition)
    return np.array(cand).reshape(-1, TOP_K), np.array(edges).reshape(-1, TOP_K, TOP_K)


@pytest.mark.parametrize("dense_first_row", [False, True])
def test_lattice_core_matches_formula(dense_first_row):
    rng = np.random.default_rng(11)
    w1, w2 = (rng.standard_normal((VOCAB, RANK)).astype(np.float32) for _ in range(2))
    begins = begins_of(COUNTS)
    unary = rng.standard_normal((begins[-1], VOCAB)).astype(np.float32)
    anchors = rng.integers(0, VOCAB, len(COUNTS))
    got = toy_head(w1, w2, dense_first_row)(
        {"logits": unary, "prev_token_ids": anchors.astype(np.int64), "candidate_begins": begins}
    )
    ir_edges, ref_edges = [], []
    for s, (b, e) in enumerate(pairwise(begins)):
        cand, edges = expected_lattice(unary[b:e], anchors[s], w1, w2, dense_first_row)
        np.testing.assert_array_equal(got["candidate_ids"][b:e], cand, err_msg=f"sequence {s}")
        ir_edges.append(got["edge_scores"][b:e].ravel())
        ref_edges.append(edges.ravel())
    err = nmse(np.concatenate(ir_edges), np.concatenate(ref_edges))
    print(f"lattice core, dense_first_row={dense_first_row}: edge_scores NMSE {err:.2e}")
    assert err < F32_NMSE, f"dense_first_row={dense_first_row}: edge_scores NMSE {err:.2e}"


def test_greedy_walk_matches_a_direct_loop_per_sequence():
    rng = np.random.default_rng(12)
    begins = begins_of(COUNTS)
    ids = rng.integers(0, VOCAB, (begins[-1], TOP_K))
    edges = rng.standard_normal((begins[-1], TOP_K, TOP_K))
    firsts = begins[:-1][np.diff(begins) > 0]
    edges[firsts] = edges[firsts, :1]  # every predecessor of a sequence's first row is its anchor
    walks = greedy_walk(ids, edges, begins)
    assert [len(w) for w in walks] == COUNTS
    for s, (b, e) in enumerate(pairwise(begins)):
        np.testing.assert_array_equal(walks[s], reference_walk(ids[b:e], edges[b:e]), err_msg=f"sequence {s}")


def test_greedy_walk_follows_the_chosen_predecessor_not_the_best_row():
    """Row 2's best edge overall starts from candidate 1, but the walk chose candidate 0 on row 1, so it stays there."""
    ids = np.array([[7, 8], [5, 6], [3, 4]])
    edges = np.array(
        [
            [[1.0, 0.0], [1.0, 0.0]],  # first row: predecessor is the anchor; candidate 0 (token 7)
            [[2.0, 0.0], [0.0, 0.0]],  # from 7: candidate 0 (token 5)
            [[0.0, 1.0], [9.0, 0.0]],  # from 5: candidate 1 (token 4); from 6 (not taken) token 3 would score 9
        ]
    )
    assert greedy_walk(ids, edges, np.array([0, 3]))[0].tolist() == [7, 5, 4]

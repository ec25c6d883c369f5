"""Greedy walk of a packed Top-K lattice (outputs of a Markov head IR) into one proposal per sequence."""

from __future__ import annotations

from itertools import pairwise

import numpy as np


def walk(edge_scores: np.ndarray, candidate_begins: np.ndarray) -> np.ndarray:
    """Greedy walk (not Viterbi) of every sequence's lattice: edge_scores [R, K, K] -> chosen candidate index [R].

    Row j of a sequence takes the best successor of the candidate chosen on row j-1; on its first row every
    predecessor index stands for the anchor, so the walk starts from index 0.
    """
    begins = np.asarray(candidate_begins, np.int64)
    counts = np.diff(begins)
    chosen = np.zeros(len(edge_scores), np.int64)  # [R]
    previous = np.zeros(len(counts), np.int64)  # [S]
    for j in range(int(counts.max(initial=0))):  # row j of every sequence that has one, all at once
        live = np.flatnonzero(counts > j)
        rows = begins[live] + j
        previous[live] = np.argmax(edge_scores[rows, previous[live]], axis=-1)
        chosen[rows] = previous[live]
    return chosen


def walk_tokens(
    candidate_ids: np.ndarray, edge_scores: np.ndarray, candidate_begins: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The greedy walk's token on every row, and the candidate index it took there: ([R] ids, [R] indices)."""
    chosen = walk(edge_scores, candidate_begins)
    return np.take_along_axis(np.asarray(candidate_ids), chosen[:, None], -1)[:, 0], chosen


def greedy_walk(candidate_ids: np.ndarray, edge_scores: np.ndarray, candidate_begins: np.ndarray) -> list[np.ndarray]:
    """candidate_ids [R, K], edge_scores [R, K, K], candidate_begins [S+1] -> S arrays of proposed token ids."""
    tokens, _ = walk_tokens(candidate_ids, edge_scores, candidate_begins)  # [R]
    return [tokens[b:e] for b, e in pairwise(np.asarray(candidate_begins, np.int64))]

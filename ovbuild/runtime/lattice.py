"""Greedy walk of a packed Top-K lattice (outputs of a Markov head IR) into one proposal per sequence."""

from __future__ import annotations

from itertools import pairwise

import numpy as np


def greedy_walk(candidate_ids: np.ndarray, edge_scores: np.ndarray, candidate_begins: np.ndarray) -> list[np.ndarray]:
    """candidate_ids [R, K], edge_scores [R, K, K], candidate_begins [S+1] -> S arrays of proposed token ids.

    The selector's walk (not Viterbi): each row takes the best successor of the candidate chosen on the row before;
    a sequence's first row starts from its anchor, which every predecessor index stands for.
    """
    begins = np.asarray(candidate_begins, np.int64)
    counts = np.diff(begins)
    chosen = np.zeros(len(candidate_ids), np.int64)  # [R]: index of the chosen candidate on each row
    previous = np.zeros(len(counts), np.int64)  # [S]
    for j in range(int(counts.max(initial=0))):  # the j-th row of every sequence that has one, all at once
        live = np.flatnonzero(counts > j)
        rows = begins[live] + j
        previous[live] = np.argmax(edge_scores[rows, previous[live]], axis=-1)
        chosen[rows] = previous[live]
    tokens = np.take_along_axis(np.asarray(candidate_ids), chosen[:, None], -1)[:, 0]  # [R]
    return [tokens[b:e] for b, e in pairwise(begins)]

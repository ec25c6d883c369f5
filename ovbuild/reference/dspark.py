"""Numpy reference of DeepSpec's Qwen3DSparkModel: the DFlash backbone with candidate offset 0, the sequential
Markov head as the authors run it, the confidence head with its truncation rule, and the Top-K lattice formula.

Sequential head, x_0 = the anchor, for each block row k (U_k the row's base logits, h_k its post-norm hidden state):
    vanilla: logits_k = U_k + W2 W1[x_{k-1}]
    gated:   logits_k = U_k + W2 (sigmoid(gate_proj [h_k ; W1[x_{k-1}]]) * W1[x_{k-1}])
    x_k = argmax logits_k
Confidence: c_k = sigmoid(w . [h_k ; W1[x_{k-1}]] + b) (or w . h_k + b); a proposal keeps the rows before the first
row with c_k < threshold (threshold 0 = off).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ovbuild.reference.dflash import DFlashReference
from ovbuild.reference.weights import ReferenceWeights, load
from ovbuild.weights.families.dspark import DSparkConfig

if TYPE_CHECKING:
    from ovbuild.weights.tensor_names import WeightSource


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def confident_prefix(confidence: np.ndarray, threshold: float) -> int:
    """Rows kept: those before the first row whose confidence is strictly below `threshold` (0 = keep all)."""
    if threshold <= 0:
        return len(confidence)
    low = np.flatnonzero(np.asarray(confidence) < threshold)
    return int(low[0]) if len(low) else len(confidence)


def top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """Ids of the k largest scores per row, by descending score, ties by lower id: [m, V] -> [m, k]."""
    return np.argsort(-scores, axis=-1, kind="stable")[:, :k]


class DSparkReference(DFlashReference):
    """A DSpark or DeepSpec DFlash draft: the backbone step, then the heads on its candidate rows."""

    def __init__(
        self, cfg: DSparkConfig, draft: WeightSource | ReferenceWeights, target: WeightSource | ReferenceWeights
    ):
        super().__init__(cfg, draft, target)
        h, v, r = cfg.hidden_size, cfg.vocab_size, cfg.markov_rank
        if r:
            self.w1 = load(self.weights, "markov_head.markov_w1", (v, r))
            self.w2 = load(self.weights, "markov_head.markov_w2", (v, r))
        if cfg.markov_head_type == "gated":
            self.gate = load(self.weights, "markov_head.gate_proj", (r, h + r))
            self.gate_bias = load(self.weights, "markov_head.gate_proj.bias", (r,))
        if cfg.enable_confidence_head:
            self.confidence_w = load(self.weights, "confidence_head.proj", (1, cfg.confidence_width))[0]
            self.confidence_b = load(self.weights, "confidence_head.proj.bias", (1,))[0]

    def markov_bias(self, previous: int, h: np.ndarray) -> np.ndarray:
        """The full-vocabulary bias [V] of a row with hidden state h [H] whose previous token is `previous`."""
        e = self.w1[previous]  # [r]
        if self.cfg.markov_head_type == "gated":
            e = sigmoid(self.gate @ np.concatenate([h, e]) + self.gate_bias) * e
        return self.w2 @ e

    def confidence(self, h: np.ndarray, previous: int) -> float:
        """sigmoid(w . [h ; W1[previous]] + b), or sigmoid(w . h + b) for a confidence head without Markov part."""
        features = np.concatenate([h, self.w1[previous]]) if self.cfg.confidence_head_with_markov else h
        return float(sigmoid(self.confidence_w @ features + self.confidence_b))

    def sequential_head(
        self, logits: np.ndarray, hidden: np.ndarray, anchor: int
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """The authors' greedy loop over one block: tokens [B] and, with a confidence head, confidences [B]."""
        tokens, confidences, previous = [], [], anchor
        for k in range(len(logits)):
            row = logits[k] + self.markov_bias(previous, hidden[k]) if self.cfg.markov_rank else logits[k]
            if self.cfg.enable_confidence_head:
                confidences.append(self.confidence(hidden[k], previous))
            previous = int(np.argmax(row))
            tokens.append(previous)
        return np.array(tokens, np.int64), np.array(confidences) if self.cfg.enable_confidence_head else None

    def lattice(
        self, logits: np.ndarray, hidden: np.ndarray, anchor: int, k: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Top-K lattice of one block with the dense first step: candidates [m, K], edges [m, K, K], predecessors.

        Row 0 takes TopK of U_0 + bias(anchor) over the whole vocabulary and edges[0, a, b] = that score of C_0[b];
        row j > 0: C_j = TopK(U_j), edges[j, a, b] = U_j[C_j[b]] + bias(C_{j-1}[a], h_j)[C_j[b]].
        predecessors [m, K]: the token behind each predecessor index (the anchor on row 0).
        """
        m = len(logits)
        first = logits[0] + self.markov_bias(anchor, hidden[0])  # [V]
        candidates = np.concatenate([top_k(first[None], k), top_k(logits[1:], k)])  # [m, K]
        predecessors = np.concatenate([np.full((1, k), anchor), candidates[:-1]])[:m]  # [m, K]
        edges = np.empty((m, k, k))
        edges[0] = first[candidates[0]][None, :]
        for j in range(1, m):
            for a in range(k):
                edges[j, a] = (logits[j] + self.markov_bias(int(predecessors[j, a]), hidden[j]))[candidates[j]]
        return candidates, edges, predecessors

    def predecessor_confidence(self, hidden: np.ndarray, predecessors: np.ndarray) -> np.ndarray:
        """Confidence of every row under each of its predecessors: hidden [m, H], predecessors [m, K] -> [m, K]."""
        return np.array(
            [[self.confidence(h, int(p)) for p in row] for h, row in zip(hidden, predecessors, strict=True)]
        )

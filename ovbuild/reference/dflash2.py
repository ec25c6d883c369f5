"""Numpy reference of a DFlash v2 draft step (one sequence) and of its candidate selector.

The layer wraps the v1 layer with two grouped dynamic convolutions over the rows of the block (taps never reach
before the block start); the selector scores a Top-K lattice of the candidate rows and is walked greedily.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ovbuild.reference.dflash import DFlashReference
from ovbuild.reference.layers import linear, rms_norm
from ovbuild.reference.qwen3 import KVCache
from ovbuild.reference.weights import LayerWeights, ReferenceWeights, load
from ovbuild.weights.families.dflash2 import CONVS, DFlash2Config

if TYPE_CHECKING:
    from ovbuild.weights.tensor_names import WeightSource


def grouped_dynamic_conv(z: np.ndarray, dyn: np.ndarray, base: np.ndarray, group_size: int) -> np.ndarray:
    """One block: out[t, g*gs + c] = sum_o (base[o, g*gs + c] + dyn[t, o, g]) * z[t - o, g*gs + c], z before 0 = 0.

    z [Q, H], dyn [Q, k, G], base [k, H]; a plain loop over rows, taps and groups.
    """
    rows, kernel, groups = dyn.shape
    out = np.zeros_like(z)
    for t in range(rows):
        for o in range(min(kernel, t + 1)):
            for g in range(groups):
                c = slice(g * group_size, (g + 1) * group_size)
                out[t, c] += (base[o, c] + dyn[t, o, g]) * z[t - o, c]
    return out


@dataclass
class ConvWeights:
    base_kernel: np.ndarray  # [2, k, H]: stage 0 (prepare), stage 1 (finish)
    kernel_projection: np.ndarray  # [2 * k * G, H]


class DynamicConv:
    """A conv module with its coefficients for one block, projected from the normalized sublayer input u [Q, H]."""

    def __init__(self, w: ConvWeights, u: np.ndarray, cfg: DFlash2Config):
        self.w, self.group_size = w, cfg.conv_group_size
        self.dyn = linear(u, w.kernel_projection).reshape(len(u), 2, cfg.conv_kernel_size, cfg.conv_groups)

    def prepare(self, u: np.ndarray) -> np.ndarray:
        return grouped_dynamic_conv(u, self.dyn[:, 0], self.w.base_kernel[0], self.group_size)

    def finish(self, y: np.ndarray) -> np.ndarray:
        return grouped_dynamic_conv(y, self.dyn[:, 1], self.w.base_kernel[1], self.group_size)


@dataclass
class SelectorWeights:
    hidden_projection: np.ndarray  # [r, H]
    predecessor_codebook: np.ndarray  # [V, r]
    successor_codebook: np.ndarray  # [V, r]


def selector_lattice(
    logits: np.ndarray, hidden: np.ndarray, anchor: int, top_k: int, w: SelectorWeights
) -> tuple[np.ndarray, np.ndarray]:
    """Candidates [m, K] (by descending logit) and edges [m, K, K] of one sequence's m candidate rows.

    edges[j, a, b] = logits[j, C_j[b]] + sum_r PC[pred_j[a], r] * (h_j Wh^T)[r] * SC[C_j[b], r],
    pred_j = [anchor] * K for the first row, C_{j-1} after.
    """
    cand = np.argsort(-logits, axis=-1, kind="stable")[:, :top_k]  # [m, K]
    unary = np.take_along_axis(logits, cand, -1).astype(np.float64)  # [m, K]
    gate = linear(hidden, w.hidden_projection)  # [m, r]
    pred = np.concatenate([np.full((1, top_k), anchor), cand[:-1]])[: len(cand)]  # [m, K]
    transition = np.einsum(
        "mar,mr,mbr->mab", w.predecessor_codebook[pred], gate, w.successor_codebook[cand]
    )  # [m, K, K]
    return cand, unary[:, None, :] + transition


def greedy_walk(cand: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """The authors' walk (not Viterbi): from the anchor, take the best successor of the previous choice, row by row."""
    tokens, prev = [], 0  # on the first row every predecessor is the anchor, so any index works
    for j in range(len(cand)):
        prev = int(np.argmax(edges[j, prev]))
        tokens.append(int(cand[j, prev]))
    return np.array(tokens, np.int64)


class DFlash2Reference(DFlashReference):
    """A DFlash v2 draft: the v1 step with convolved sublayers, plus the selector of its candidate rows."""

    def __init__(
        self, cfg: DFlash2Config, draft: WeightSource | ReferenceWeights, target: WeightSource | ReferenceWeights
    ):
        super().__init__(cfg, draft, target)
        h, k, groups, v, r = cfg.hidden_size, cfg.conv_kernel_size, cfg.conv_groups, cfg.vocab_size, cfg.selector_rank
        self.convs = [
            {
                c: ConvWeights(
                    load(self.weights, f"layers.{i}.{c}.base_kernel", (2, k, h)),
                    load(self.weights, f"layers.{i}.{c}.kernel_projection", (2 * k * groups, h)),
                )
                for c in CONVS
            }
            for i in range(cfg.num_layers)
        ]
        self.selector = SelectorWeights(
            load(self.weights, "candidate_selector.hidden_projection", (r, h)),
            load(self.weights, "candidate_selector.predecessor_codebook", (v, r)),
            load(self.weights, "candidate_selector.successor_codebook", (v, r)),
        )

    def _layer(
        self, i: int, w: LayerWeights, x: np.ndarray, c: np.ndarray, positions: np.ndarray, cache: KVCache
    ) -> np.ndarray:
        cfg, eps = self.cfg, self.eps
        u = rms_norm(x, w.input_layernorm, eps)
        attention_conv = DynamicConv(self.convs[i]["attention_conv"], u, cfg)
        # block queries, keys and values all come from the convolved input
        x = x + attention_conv.finish(self._attend(i, w, attention_conv.prepare(u), c, positions, cache))
        u2 = rms_norm(x, w.post_attention_layernorm, eps)
        mlp_conv = DynamicConv(self.convs[i]["mlp_conv"], u2, cfg)
        return x + mlp_conv.finish(self._mlp(w, mlp_conv.prepare(u2)))

    def lattice(self, logits: np.ndarray, hidden: np.ndarray, anchor: int) -> tuple[np.ndarray, np.ndarray]:
        """Selector lattice of one step's candidate rows (logits after the transforms, post-norm hidden states)."""
        return selector_lattice(logits, hidden, anchor, self.cfg.selector_top_k, self.selector)

"""Numpy reference of the Qwen3.5-family mixture-of-experts MLP (routing included) and of the MoE hybrid target,
in float64. Formulas: docs/moe.md."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ovbuild.reference.hybrid import HybridReference, zero_norm
from ovbuild.reference.layers import linear, swiglu_mlp
from ovbuild.reference.weights import ReferenceWeights

if TYPE_CHECKING:
    from ovbuild.weights.moe import MoeSpec


def top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices [n, k] of each row's k largest scores, largest first; equal scores in index order (lower index
    first), as torch.topk returns them."""
    return np.argsort(-scores, axis=-1, kind="stable")[:, :k]


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def route(x: np.ndarray, router: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Routing weights [n, k] (renormalised to sum to 1) and expert indices [n, k] of rows x [n, H]."""
    probs = softmax(linear(x, router))  # [n, E]
    chosen = top_k(probs, k)
    weights = np.take_along_axis(probs, chosen, -1)
    return weights / weights.sum(-1, keepdims=True), chosen


@dataclass
class MoeWeights:
    """One layer's MoE MLP in float64: router [E, H], gate_up [E, 2I, H], down [E, H, I], the shared expert."""

    router: np.ndarray
    gate_up: np.ndarray
    down: np.ndarray
    shared_gate: np.ndarray  # [1, H]
    shared: tuple[np.ndarray, np.ndarray, np.ndarray]  # gate [S, H], up [S, H], down [H, S]

    @classmethod
    def load(cls, w: ReferenceWeights, i: int, spec: MoeSpec, h: int) -> MoeWeights:
        from ovbuild.weights.moe import expert_layout

        e, inter, s, p = (
            spec.num_experts,
            spec.expert_intermediate_size,
            spec.shared_intermediate_size,
            f"layers.{i}.mlp",
        )
        if expert_layout(w, i) == "fused":
            gate_up = w.get(f"{p}.experts.gate_up_proj", (e, 2 * inter, h))
            down = w.get(f"{p}.experts.down_proj", (e, h, inter))
        else:
            gate_up = np.stack(
                [
                    np.concatenate([w.get(f"{p}.experts.{x}.{m}_proj", (inter, h)) for m in ("gate", "up")])
                    for x in range(e)
                ]
            )
            down = np.stack([w.get(f"{p}.experts.{x}.down_proj", (h, inter)) for x in range(e)])
        shared = tuple(
            w.get(f"{p}.shared_expert.{m}_proj", sh) for m, sh in (("gate", (s, h)), ("up", (s, h)), ("down", (h, s)))
        )
        return cls(w.get(f"{p}.gate", (e, h)), gate_up, down, w.get(f"{p}.shared_expert_gate", (1, h)), shared)


def moe_mlp(x: np.ndarray, w: MoeWeights, k: int) -> np.ndarray:
    """out = Σ_k w_e · down_e(silu(gate_e x) · up_e x) + sigmoid(shared_gate · x) · shared(x), row by row."""
    weights, chosen = route(x, w.router, k)
    inter = w.down.shape[-1]
    out = np.zeros_like(x)
    for r in range(len(x)):
        for weight, e in zip(weights[r], chosen[r], strict=True):
            gate, up = w.gate_up[e, :inter], w.gate_up[e, inter:]
            out[r] += weight * swiglu_mlp(x[r : r + 1], gate, up, w.down[e])[0]
    gate = 1.0 / (1.0 + np.exp(-linear(x, w.shared_gate)))  # [n, 1]
    return out + gate * swiglu_mlp(x, *w.shared)


class MoeHybridReference(HybridReference):
    """The hybrid target with every MLP a mixture of experts (a HybridTargetConfig with `moe`)."""

    def _mlp(self, i: int, x: np.ndarray) -> np.ndarray:
        c = self.cfg
        u = zero_norm(x, self._get(i, "post_attention_layernorm", (c.hidden_size,)), self.eps)
        return moe_mlp(u, MoeWeights.load(self.w, i, c.moe, c.hidden_size), c.moe.top_k)

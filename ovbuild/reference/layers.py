"""Numpy building blocks of the reference models, in float64: the golden semantics every graph is checked against.

Each function mirrors one graph building block; none of this is shared with the graph builders.
"""

from __future__ import annotations

import numpy as np

from ovbuild.reference.rope import ReferenceRope

REF_DTYPE = np.float64


def linear(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """x [n, in] @ w[out, in]^T -> [n, out] (checkpoint Linear layout)."""
    return x @ w.T


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """RMSNorm over the last axis."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def swiglu_mlp(x: np.ndarray, gate: np.ndarray, up: np.ndarray, down: np.ndarray) -> np.ndarray:
    """down(silu(gate x) * up x)."""
    g = linear(x, gate)
    return linear(g / (1.0 + np.exp(-g)) * linear(x, up), down)


def rope(x: np.ndarray, positions: np.ndarray, r: ReferenceRope) -> np.ndarray:
    """Neox-style rotary embedding. x: [n, heads, head_dim], positions: [n]."""
    d = x.shape[-1]
    angles = positions.astype(REF_DTYPE)[:, None] * r.inv_freq[None]  # [n, d/2]
    cos = np.cos(np.concatenate([angles, angles], -1))[:, None] * r.attention_factor  # [n, 1, d]
    sin = np.sin(np.concatenate([angles, angles], -1))[:, None] * r.attention_factor
    rotated = np.concatenate([-x[..., d // 2 :], x[..., : d // 2]], -1)
    return x * cos + rotated * sin


def visibility(
    q_pos: np.ndarray, k_pos: np.ndarray, *, window: int = 0, bidirectional: np.ndarray | None = None
) -> np.ndarray:
    """[n_q, n_k] bool: causal, opened between keys and queries of the same bidirectional group, then windowed.

    bidirectional: per query and per key, a group id (-1 = causal row); rows of one group see each other.
    window W keeps keys with |q_pos - k_pos| < W (the future side only matters inside a bidirectional group).
    """
    qp, kp = q_pos[:, None], k_pos[None, :]
    mask = kp <= qp
    if bidirectional is not None:
        gq, gk = bidirectional
        mask |= (gq[:, None] == gk[None, :]) & (gq[:, None] >= 0)
    if window:
        mask &= (qp - kp < window) & (kp - qp < window)
    return mask


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Softmax attention with GQA. q [n, H, D], k/v [T, KV, D], mask [n, T] bool -> [n, H * D]."""
    n, heads, d = q.shape
    group = heads // k.shape[1]
    k = np.repeat(k, group, axis=1)  # [T, H, D]
    v = np.repeat(v, group, axis=1)
    scores = np.einsum("nhd,thd->hnt", q, k) / np.sqrt(d)
    scores = np.where(mask[None], scores, -np.inf)
    scores -= scores.max(-1, keepdims=True)
    p = np.exp(scores)
    p /= p.sum(-1, keepdims=True)
    return np.einsum("hnt,thd->nhd", p, v).reshape(n, heads * d)


def nmse(actual: np.ndarray, expected: np.ndarray) -> float:
    """mean((a - b)^2) / mean(b^2): the one parity figure every test reports."""
    a, b = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    return float(np.mean((a - b) ** 2) / max(np.mean(b * b), 1e-300))

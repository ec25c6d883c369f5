"""Numpy reference of a Gated DeltaNet layer's core: the causal depthwise conv with its state, and the gated delta
rule in two forms that must agree, token by token (recurrent) and a chunk of tokens at a time (chunked).

Shapes are per sequence and per value head: q, k [n, heads, dk], v [n, heads, dv], g (log decay) and beta [n, heads],
state [heads, dk, dv]. Formulas: docs/hybrid.md.
"""

from __future__ import annotations

import numpy as np


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def causal_conv(x: np.ndarray, state: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """Depthwise causal conv of x [n, C] after the K-1 inputs held in state [C, K-1] (oldest first), w [C, K].

    Returns silu(conv) [n, C] and the state after each row (the K-1 newest inputs, [C, K-1] each).
    """
    kernel = w.shape[1]
    window = np.concatenate([state.T, x])  # [K-1 + n, C]: the past inputs, then the new ones
    out = np.stack([np.sum(window[t : t + kernel].T * w, axis=1) for t in range(len(x))]) if len(x) else x
    states = [window[t + 1 : t + kernel].T.copy() for t in range(len(x))]
    return silu(out), states


def delta_rule_recurrent(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray, state: np.ndarray
) -> tuple[np.ndarray, list[np.ndarray]]:
    """One token at a time: decay the state, write the part of v it does not predict yet, read it with q.

    Returns the outputs [n, heads, dv] and the state after each row.
    """
    s = state.copy()
    out, states = np.zeros(v.shape), []
    for t in range(len(q)):
        s = s * np.exp(g[t])[:, None, None]
        predicted = np.einsum("hk,hkv->hv", k[t], s)  # what the decayed state recalls for key k_t
        s = s + np.einsum("hk,hv->hkv", k[t], (v[t] - predicted) * beta[t][:, None])
        out[t] = np.einsum("hk,hkv->hv", q[t], s)
        states.append(s.copy())
    return out, states


def delta_rule_chunked(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray, state: np.ndarray, chunk: int = 64
) -> tuple[np.ndarray, np.ndarray]:
    """The same rule a chunk at a time: inside a chunk the writes u solve one unit-lower-triangular system, then the
    outputs and the chunk's end state are matrix products. Returns the outputs and the final state only."""
    s = state.copy()
    out = np.zeros(v.shape)
    for begin in range(0, len(q), chunk):
        rows = slice(begin, min(begin + chunk, len(q)))
        out[rows], s = _chunk(q[rows], k[rows], v[rows], g[rows], beta[rows], s)
    return out, s


def _chunk(q, k, v, g, beta, s0):
    n = len(q)
    gamma = np.cumsum(g, axis=0)  # [n, heads]: log of the decay from the chunk's start through row t
    causal = np.tril(np.ones((n, n), bool))
    # decay[h, t, s] = exp(gamma_t - gamma_s) for s <= t, the decay a write at row s has felt by row t
    diff = gamma.T[:, :, None] - gamma.T[:, None, :]
    decay = np.where(causal, np.exp(np.where(causal, diff, 0.0)), 0.0)
    kk = np.einsum("thd,shd->hts", k, k)  # [heads, n, n]
    # writes: u_t = beta_t (v_t - exp(gamma_t) k_t S0 - sum_{s<t} decay_ts (k_t . k_s) u_s)
    system = np.eye(n)[None] + beta.T[:, :, None] * np.tril(decay * kk, -1)  # [heads, n, n], unit lower triangular
    rhs = beta.T[:, :, None] * (v.transpose(1, 0, 2) - np.exp(gamma.T)[:, :, None] * np.einsum("thd,hdv->htv", k, s0))
    u = np.linalg.solve(system, rhs)  # [heads, n, dv]
    qk = np.einsum("thd,shd->hts", q, k) * decay
    out = np.exp(gamma.T)[:, :, None] * np.einsum("thd,hdv->htv", q, s0) + qk @ u  # [heads, n, dv]
    end = np.exp(gamma[-1] - gamma)  # [n, heads]: decay from each row to the chunk's end
    s = np.exp(gamma[-1])[:, None, None] * s0 + np.einsum("sh,shd,hsv->hdv", end, k, u)
    return out.transpose(1, 0, 2), s

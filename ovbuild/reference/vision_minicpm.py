"""MiniCPM-V 4.7's vision tower, window merger and merger in numpy, written the way transformers'
`modeling_minicpmv4_7.py` computes them (loops per image and per window, its position bucketing and window index),
in float64 from the checkpoint's f32 values. It shares nothing with `ovbuild/graph/vision/minicpm.py`, whose index
arithmetic is in-graph: a parity test between the two compares two derivations of the same layout.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from ovbuild.weights.tensor_names import WeightSource
from ovbuild.weights.vision_minicpm import MiniCPMVisionConfig, MiniCPMVisionWeights, tensor_params


def load_arrays(weights: MiniCPMVisionWeights) -> dict[str, np.ndarray]:
    """Every tensor the configured tower reads, `canonical.param` -> float64."""
    return {
        f"{n}.{p}": np.asarray(weights.get(n, p).to_f32(), np.float64)
        for n in weights.canonical_names()
        for p in tensor_params(n)
    }


def nearest_position_ids(target_sizes: np.ndarray, side: int) -> np.ndarray:
    """transformers' `get_vision_nearest_position_ids`: row i / h and column j / w (float32) bucketized against
    `torch.arange(1/side, 1.0, 1/side)` (float32 values of the float64 sum), row-major per image, concatenated."""
    step = 1.0 / side
    count = math.ceil((1.0 - step) / step)
    boundaries = np.array([step + step * k for k in range(count)], np.float64).astype(np.float32)
    ids = []
    for h, w in target_sizes.tolist():
        bucket_h = np.searchsorted(boundaries, np.arange(h, dtype=np.float32) / np.float32(h), side="right")
        bucket_w = np.searchsorted(boundaries, np.arange(w, dtype=np.float32) / np.float32(w), side="right")
        ids.append((bucket_h[:, None] * side + bucket_w).reshape(-1))
    return np.concatenate(ids)


def window_index(target_sizes: np.ndarray, window: int) -> tuple[np.ndarray, np.ndarray]:
    """transformers' `get_vision_window_index` with spatial_merge_size 1 and patch_size 1: the order that puts each
    window's patches together (windows row-major, patches row-major inside), and the windows' cumulative lengths."""
    order, cu = [], [0]
    offset = 0
    for h, w in target_sizes.tolist():
        index = np.arange(h * w).reshape(h, w)
        pad_h, pad_w = window - h % window, window - w % window  # a full extra window when it divides: as published
        padded = np.pad(index, ((0, pad_h), (0, pad_w)), constant_values=-100)
        nh, nw = (h + pad_h) // window, (w + pad_w) // window
        padded = padded.reshape(nh, window, nw, window).transpose(0, 2, 1, 3).reshape(nh * nw, window * window)
        lengths = (padded != -100).sum(1)
        flat = padded.reshape(-1)
        order.append(flat[flat != -100] + offset)
        cu.extend((np.cumsum(lengths) + cu[-1]).tolist())
        offset += h * w
    cu_unique = [cu[0]] + [b for a, b in itertools.pairwise(cu) if b != a]  # unique_consecutive
    return np.concatenate(order), np.array(cu_unique)


def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * weight + bias


def gelu(x: np.ndarray, form: str) -> np.ndarray:
    """GELU, exact ("erf", nn.GELU()) or the tanh form (gelu_pytorch_tanh)."""
    if form == "tanh":
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))
    erf = np.vectorize(math.erf, otypes=[np.float64])
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def linear(a: dict[str, np.ndarray], name: str, x: np.ndarray) -> np.ndarray:
    return x @ a[f"{name}.weight"].T + a[f"{name}.bias"]


def attention(a: dict, name: str, x: np.ndarray, cu_seqlens: np.ndarray, heads: int) -> np.ndarray:
    """`MiniCPMV4_7VisionAttention` without flash attention: each [cu[k], cu[k+1]) span attends to itself only.
    x: [L, D] -> [L, D]."""
    n, d = x.shape
    hd = d // heads
    q = linear(a, f"{name}.q_proj", x).reshape(n, heads, hd)  # [L, heads, head_dim]
    k = linear(a, f"{name}.k_proj", x).reshape(n, heads, hd)
    v = linear(a, f"{name}.v_proj", x).reshape(n, heads, hd)
    out = np.zeros_like(q)
    for s, e in itertools.pairwise(cu_seqlens):
        scores = np.einsum("qhd,khd->hqk", q[s:e], k[s:e]) * hd**-0.5
        p = np.exp(scores - scores.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        out[s:e] = np.einsum("hqk,khd->qhd", p, v[s:e])
    return linear(a, f"{name}.out_proj", out.reshape(n, d))


def cu_of(target_sizes: np.ndarray) -> np.ndarray:
    """Cumulative patch counts [0, n_0, n_0 + n_1, ...]."""
    return np.concatenate([[0], np.cumsum(target_sizes[:, 0] * target_sizes[:, 1])])


def encoder_layer(cfg: MiniCPMVisionConfig, a: dict, i: int, x: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """`MiniCPMV4_7VisionEncoderLayer`: pre-LayerNorm attention and MLP, each added to its input."""
    eps, name = cfg.layer_norm_eps, f"layers.{i}"
    h = layer_norm(x, a[f"{name}.layer_norm1.weight"], a[f"{name}.layer_norm1.bias"], eps)
    x = x + attention(a, name, h, cu_of(sizes), cfg.num_heads)
    h = layer_norm(x, a[f"{name}.layer_norm2.weight"], a[f"{name}.layer_norm2.bias"], eps)
    return x + linear(a, f"{name}.fc2", gelu(linear(a, f"{name}.fc1", h), cfg.activation))


def window_merger(cfg: MiniCPMVisionConfig, a: dict, x: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """`MiniCPMV4_7ViTWindowAttentionMerger`: attention inside each k x k window, then each window's k*k patches
    (concatenated) through pre_norm, linear_1, tanh-GELU, linear_2, plus their mean. x: [L, D] -> [L / k^2, D]."""
    eps, k2 = cfg.layer_norm_eps, cfg.window_kernel**2
    order, cu = window_index(sizes, cfg.window_kernel)
    h = layer_norm(x, a["window.layer_norm1.weight"], a["window.layer_norm1.bias"], eps)[order]
    x = x[order] + attention(a, "window", h, cu, cfg.num_heads)
    if len(cu) - 1 != x.shape[0] // k2:
        raise ValueError(f"patch grids {sizes.tolist()} are not divisible by the window {cfg.window_kernel}")
    patch = x.reshape(-1, k2, x.shape[-1])  # [windows, k*k, D]
    flat = patch.reshape(patch.shape[0], -1)  # [windows, k*k*D]
    h = layer_norm(flat, a["window.pre_norm.weight"], a["window.pre_norm.bias"], eps)
    h = linear(a, "window.linear_2", gelu(linear(a, "window.linear_1", h), "tanh"))
    return h + patch.mean(1)


def vision_tower(cfg: MiniCPMVisionConfig, a: dict, pixel_values: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """`MiniCPMV4_7VisionModel.forward`: pixel_values [1, C, p, L*p] (patches side by side), sizes [N, 2] ->
    [L', D], L' = L / 4 in 16x mode (the window merger after layer insert_layer_id), L in 4x."""
    p, d = cfg.patch_size, cfg.hidden_size
    _, c, _, width = pixel_values.shape
    patches = pixel_values[0].reshape(c, p, width // p, p).transpose(2, 0, 1, 3)  # [L, C, p, p]
    w = a["patch_embedding.weight"].reshape(d, -1)  # the stride-p conv as a matrix: [D, C*p*p]
    x = patches.reshape(patches.shape[0], -1).astype(np.float64) @ w.T + a["patch_embedding.bias"]
    x = x + a["position_embedding.weight"][nearest_position_ids(sizes, cfg.positions_per_side)]
    for i in range(cfg.num_layers):
        x = encoder_layer(cfg, a, i, x, sizes)
        if cfg.uses_window_merger and i == cfg.insert_layer_id:
            x = window_merger(cfg, a, x, sizes)
            sizes = sizes // 2  # get_downsampled_inputs
    return layer_norm(x, a["post_layernorm.weight"], a["post_layernorm.bias"], cfg.layer_norm_eps)


def downsample_mlp(a: dict, m: int, x: np.ndarray) -> np.ndarray:
    """`MiniCPMV4_7DownsampleMLP`: LayerNorm(eps 1e-6) over the grouped width, linear_1, exact GELU, linear_2."""
    name = f"merger.{m}"
    h = layer_norm(x, a[f"{name}.pre_norm.weight"], a[f"{name}.pre_norm.bias"], 1e-6)
    return linear(a, f"{name}.linear_2", gelu(linear(a, f"{name}.linear_1", h), "erf"))


def merger(cfg: MiniCPMVisionConfig, a: dict, x: np.ndarray, sizes: np.ndarray) -> list[np.ndarray]:
    """`MiniCPMV4_7Merger`: per image, merger_times rounds of grouping kh x kw neighbours (view, permute) and a
    downsample MLP. x: [sum h*w, D] -> one [h*w / (kh*kw)^rounds, llm_hidden] array per image."""
    kh, kw = cfg.merge_kernel
    out, start = [], 0
    for height, width in sizes.tolist():
        n = height * width
        h = x[start : start + n]
        for m in range(cfg.merger_times):
            dim = h.shape[-1]
            h = h.reshape(height // kh, kh, width // kw, kw, dim).transpose(0, 2, 1, 3, 4)
            h = downsample_mlp(a, m, h.reshape(-1, kh * kw * dim))  # [groups, kh*kw*dim] -> [groups, out]
            height, width = height // kh, width // kw
        out.append(h)
        start += n
    return out


def image_features(cfg: MiniCPMVisionConfig, a: dict, pixel_values: np.ndarray, sizes: np.ndarray) -> list[np.ndarray]:
    """`MiniCPMV4_7Model.get_image_features`: the LM-width embeddings of each image, in order."""
    sizes = np.asarray(sizes, np.int64)
    hidden = vision_tower(cfg, a, np.asarray(pixel_values, np.float64), sizes)
    return merger(cfg, a, hidden, sizes // 2 if cfg.uses_window_merger else sizes)


class MiniCPMVisionReference:
    """The tower on tiny checkpoints: `forward(pixel_values, target_sizes)` -> [tokens, LM hidden], every image's
    tokens in order. `weights`: the reader `load_minicpm_vision` returns, or the WeightSource under it."""

    def __init__(self, cfg: MiniCPMVisionConfig, weights: MiniCPMVisionWeights | WeightSource):
        reader = weights if isinstance(weights, MiniCPMVisionWeights) else MiniCPMVisionWeights(weights, cfg)
        self.cfg, self.arrays = cfg, load_arrays(reader)

    def forward(self, pixel_values: np.ndarray, target_sizes: np.ndarray) -> np.ndarray:
        return np.concatenate(image_features(self.cfg, self.arrays, pixel_values, target_sizes))

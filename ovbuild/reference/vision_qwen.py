"""Numpy reference of the Qwen3.5-family vision tower (transformers' Qwen3_5VisionModel), function by function as
ovbuild/graph/vision/qwen3_5.py builds it, sharing no code with it: indices by per-image loops (as transformers
computes them), weights and activations in float64, the position-grid coordinates in float32 as torch.linspace
makes them. Formulas: docs/vision.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import erf

import numpy as np

from ovbuild.reference.layers import REF_DTYPE
from ovbuild.reference.weights import ReferenceWeights, reference_weights
from ovbuild.weights.tensor_names import WeightSource
from ovbuild.weights.vision_qwen import LAYER_NORM_EPS, QwenVisionConfig, qwen_vision_shapes

_erf = np.vectorize(erf)


@dataclass(frozen=True)
class ReferenceLayout:
    """Each packed patch's row and column in its image's grid, that grid's height and width, and its segment."""

    row: np.ndarray
    col: np.ndarray
    height: np.ndarray
    width: np.ndarray
    segment: np.ndarray


def patch_layout(grid_thw: np.ndarray, merge: int) -> ReferenceLayout:
    """Image by image, frame by frame, window by window, row by row within a window (Qwen3-VL's rot_pos_emb)."""
    rows, cols, heights, widths, segments = [], [], [], [], []
    segment = 0
    for t, h, w in np.asarray(grid_thw, np.int64):
        for _ in range(t):
            for window_row in range(h // merge):
                for window_col in range(w // merge):
                    for inner_row in range(merge):
                        for inner_col in range(merge):
                            rows.append(window_row * merge + inner_row)
                            cols.append(window_col * merge + inner_col)
                            heights.append(h)
                            widths.append(w)
                            segments.append(segment)
            segment += 1  # every frame attends within itself (cu_seqlens has one entry per frame)
    return ReferenceLayout(*(np.array(v, np.int64) for v in (rows, cols, heights, widths, segments)))


def patch_embed(pixels: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """Conv3d with stride = kernel over patches flattened as (C, T, P, P): [N, C*T*P*P] -> [N, H]."""
    return pixels.astype(REF_DTYPE) @ weight.reshape(weight.shape[0], -1).T + bias


def linspace_f32(side: int, steps: int) -> np.ndarray:
    """torch.linspace(0, side - 1, steps) in float32, both halves computed as torch's CPU kernel does."""
    if steps == 1:
        return np.zeros(1, np.float32)
    end = np.float32(side - 1)
    step = end / np.float32(steps - 1)
    i = np.arange(steps)
    low = step * i.astype(np.float32)
    high = end - step * (steps - 1 - i).astype(np.float32)
    return np.where(i < steps // 2, low, high).astype(np.float32)


def position_embedding(layout: ReferenceLayout, table: np.ndarray, side: int) -> np.ndarray:
    """The learned side x side grid sampled bilinearly with aligned corners at each patch's place: [N, H]."""
    out = np.empty((len(layout.row), table.shape[1]), REF_DTYPE)
    for n, (r, c, h, w) in enumerate(zip(layout.row, layout.col, layout.height, layout.width, strict=True)):
        y, x = linspace_f32(side, h)[r], linspace_f32(side, w)[c]
        y0, x0 = int(y), int(x)
        y1, x1 = min(y0 + 1, side - 1), min(x0 + 1, side - 1)
        dy, dx = np.float32(y - y0), np.float32(x - x0)
        one = np.float32(1.0)
        # at the grid's last row or column two corners coincide; their weights add, as the four gathers do
        corners = [
            (y0, x0, (one - dy) * (one - dx)),
            (y0, x1, (one - dy) * dx),
            (y1, x0, dy * (one - dx)),
            (y1, x1, dy * dx),
        ]
        out[n] = sum(REF_DTYPE(weight) * table[a * side + b] for a, b, weight in corners)
    return out


def rotary(layout: ReferenceLayout, head_dim: int, theta: float) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin of [row f, col f, row f, col f], f = theta^(-2j / (head_dim / 2)): each [N, 1, head_dim]."""
    half = head_dim // 2
    inv = 1.0 / theta ** (np.arange(0, half, 2, dtype=REF_DTYPE) / half)  # [head_dim / 4]
    fr, fc = layout.row[:, None] * inv, layout.col[:, None] * inv
    angles = np.concatenate([fr, fc, fr, fc], -1)
    return np.cos(angles)[:, None], np.sin(angles)[:, None]


def apply_rotary(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """x * cos + [-x2, x1] * sin over the head; x: [N, heads, head_dim]."""
    half = x.shape[-1] // 2
    return x * cos + np.concatenate([-x[..., half:], x[..., :half]], -1) * sin


def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + LAYER_NORM_EPS) * weight + bias


def activation(x: np.ndarray, act: str) -> np.ndarray:
    """transformers' ACT2FN[act]."""
    if act in ("gelu_pytorch_tanh", "gelu_new"):
        return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))
    if act == "gelu":
        return gelu_erf(x)
    if act == "quick_gelu":
        return x / (1.0 + np.exp(-1.702 * x))
    return x / (1.0 + np.exp(-x))  # silu


def gelu_erf(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + _erf(x / np.sqrt(2.0)))


def segment_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, segment: np.ndarray) -> np.ndarray:
    """Softmax attention run separately on each segment (transformers' per-chunk path); q, k, v [N, heads, d]."""
    out = np.empty_like(q)
    for s in np.unique(segment):
        rows = segment == s
        scores = np.einsum("nhd,mhd->hnm", q[rows], k[rows]) / np.sqrt(q.shape[-1])
        p = np.exp(scores - scores.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        out[rows] = np.einsum("hnm,mhd->nhd", p, v[rows])
    return out.reshape(len(q), -1)


class QwenVisionReference:
    """The tower on tiny checkpoints: `forward(pixel_values, grid_thw)` -> [N / m^2, out_hidden_size]."""

    def __init__(self, cfg: QwenVisionConfig, weights: WeightSource | ReferenceWeights):
        self.cfg, self.w = cfg, reference_weights(weights)
        self.shapes = qwen_vision_shapes(cfg)

    def tensor(self, name: str) -> np.ndarray:
        parts = name.split(".", 2)
        key = f"layers.{{i}}.{parts[2]}" if parts[0] == "layers" else name
        return self.w.get(name, self.shapes[key])

    def linear(self, x: np.ndarray, name: str) -> np.ndarray:
        return x @ self.tensor(f"{name}.weight").T + self.tensor(f"{name}.bias")

    def block(self, x: np.ndarray, i: int, layout: ReferenceLayout, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        cfg, p = self.cfg, f"layers.{i}."
        h = layer_norm(x, self.tensor(f"{p}norm1.weight"), self.tensor(f"{p}norm1.bias"))
        qkv = self.linear(h, f"{p}attn.qkv").reshape(len(x), 3, cfg.num_heads, cfg.head_dim)
        q, k = apply_rotary(qkv[:, 0], cos, sin), apply_rotary(qkv[:, 1], cos, sin)
        x = x + self.linear(segment_attention(q, k, qkv[:, 2], layout.segment), f"{p}attn.proj")
        h = layer_norm(x, self.tensor(f"{p}norm2.weight"), self.tensor(f"{p}norm2.bias"))
        h = activation(self.linear(h, f"{p}mlp.linear_fc1"), cfg.hidden_act)
        return x + self.linear(h, f"{p}mlp.linear_fc2")

    def merger(self, x: np.ndarray) -> np.ndarray:
        h = layer_norm(x, self.tensor("merger.norm.weight"), self.tensor("merger.norm.bias"))
        h = h.reshape(-1, self.cfg.merged_hidden_size)  # consecutive patches are one window
        return self.linear(gelu_erf(self.linear(h, "merger.linear_fc1")), "merger.linear_fc2")

    def forward(self, pixel_values: np.ndarray, grid_thw: np.ndarray) -> np.ndarray:
        cfg = self.cfg
        layout = patch_layout(grid_thw, cfg.spatial_merge_size)
        x = patch_embed(pixel_values, self.tensor("patch_embed.weight"), self.tensor("patch_embed.bias"))
        x = x + position_embedding(layout, self.tensor("pos_embed"), cfg.grid_side)
        cos, sin = rotary(layout, cfg.head_dim, cfg.rope_theta)
        for i in range(cfg.depth):
            x = self.block(x, i, layout, cos, sin)
        return self.merger(x)

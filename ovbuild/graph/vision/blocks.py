"""Opset blocks of vision towers: biased linear layers, LayerNorm, the MLP activations, and attention confined to
each image of a packed call."""

from __future__ import annotations

import numpy as np
import openvino as ov
import openvino.opset16 as ops

from ovbuild.graph.ops import Output, const, i64, named
from ovbuild.graph.weights import WeightPolicy, f32_constant
from ovbuild.weights.tensor_names import WeightSource

# transformers' ACT2FN name -> how the graph computes it
GELU_MODES = {"gelu_pytorch_tanh": "tanh", "gelu_new": "tanh", "gelu": "erf"}


def biased_linear(x: Output, weights: WeightSource, name: str, path: str, policy: WeightPolicy) -> Output:
    """x @ W^T + b with the checkpoint's `{name}.weight` [out, in] and `{name}.bias` [out]; x: [n, in] -> [n, out]."""
    w = policy.matrix(weights.get(f"{name}.weight"), path)
    y = ops.matmul(x, w, False, True)
    return named(ops.add(y, f32_constant(weights.get(f"{name}.bias"), f"{path}/bias")), path)


def layer_norm(x: Output, weights: WeightSource, name: str, eps: float, path: str) -> Output:
    """(x - mean) / sqrt(var + eps) * weight + bias over the last axis; x: [n, width]."""
    normalized = ops.mvn(x, i64([-1]), True, eps, "inside_sqrt")
    scaled = ops.multiply(normalized, f32_constant(weights.get(f"{name}.weight"), f"{path}/weight"))
    return named(ops.add(scaled, f32_constant(weights.get(f"{name}.bias"), f"{path}/bias")), path)


def activation(x: Output, act: str, path: str) -> Output:
    """An MLP activation by its transformers name (the config checked it is one of these)."""
    if act in GELU_MODES:
        return named(ops.gelu(x, GELU_MODES[act]), path)
    if act == "quick_gelu":  # x * sigmoid(1.702 x)
        return named(ops.multiply(x, ops.sigmoid(ops.multiply(x, const(1.702)))), path)
    return named(ops.swish(x), path)  # silu


def segment_mask(segments: Output, path: str) -> Output:
    """Additive attention mask of a packed call: 0 where two patches share a segment id, -inf elsewhere.

    segments: [n] i64 -> [n, n] f32. Every patch sees itself, so no row is all -inf.
    """
    same = ops.equal(ops.unsqueeze(segments, i64(1)), ops.unsqueeze(segments, i64(0)))  # [n, n]
    return named(ops.select(same, const(0.0), const(-np.inf)), path)


def packed_attention(q: Output, k: Output, v: Output, mask: Output, head_dim: int, path: str) -> Output:
    """Softmax attention of every patch over the patches its mask opens.

    q, k, v: [n, heads, head_dim] -> [heads, n, head_dim] for the op; out: [n, heads * head_dim].
    """
    perm = i64([1, 0, 2])
    heads = [ops.transpose(t, perm) for t in (q, k, v)]  # [heads, n, head_dim]
    out = ops.scaled_dot_product_attention(*heads, mask, const(1.0 / np.sqrt(head_dim)), causal=False)
    out = ops.transpose(out, perm)  # [n, heads, head_dim]
    return named(ops.reshape(out, i64([0, -1]), True), path)  # [n, heads * head_dim]


def rows(x: Output) -> Output:
    """The number of rows of x as a [1] i64 (x: [n, ...])."""
    return ops.gather(ops.shape_of(x, ov.Type.i64), i64([0]), i64(0)).output(0)

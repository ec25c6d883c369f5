"""RMSNorm in fp32; the CPU plugin fuses this exact pattern into its RMS kernel."""

from __future__ import annotations

import openvino.opset16 as ops

from ovbuild.graph.ops import Output, const, i64, named


def rms_norm(x: Output, weight: Output, eps: float, path: str) -> Output:
    """weight * x / sqrt(mean(x^2, last axis) + eps); x: [..., n], weight: [n]."""
    mean_sq = ops.reduce_mean(ops.power(x, const(2.0)), i64([-1]), True)
    normalized = ops.divide(x, ops.sqrt(ops.add(mean_sq, const(eps))))
    return named(ops.multiply(normalized, weight), path)

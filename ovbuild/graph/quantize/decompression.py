"""The decompression subgraph of an integer-compressed matrix, in the form OpenVINO's CPU and GPU plugins fuse into
compressed FullyConnected (MatMul) and Gather kernels, so the codes stay compressed at run time:

    codes u8/i8/u4/i4 [N, K/G, G] ─ Convert f16 ─ Subtract(Convert f16 (zero point [N, K/G, 1]))  (asymmetric only)
      ─ Multiply(scale f16 [N, K/G, 1]) ─ Reshape [N, K]  (grouped only) ─ Convert f32

With one group per output channel the codes are [N, K] and the scale and zero point [N, 1], with no Reshape.
"""

from __future__ import annotations

import openvino as ov
import openvino.opset16 as ops

from ovbuild.graph.ops import Output, i64, named
from ovbuild.graph.quantize.rtn import Scheme, quantize_into
from ovbuild.weights.tensor import WeightTensor

STORAGE_TYPES = {"u8": ov.Type.u8, "i8": ov.Type.i8, "u4": ov.Type.u4, "i4": ov.Type.i4}


def compressed_constant(tensor: WeightTensor, scheme: Scheme, path: str) -> Output:
    """The [N, K] checkpoint matrix quantized by `scheme`, as an f32-valued decompression subgraph."""
    n, k = tensor.shape
    g = scheme.group_length(k, tensor.name)
    grouped = g != k
    code_shape = [n, k // g, g] if grouped else [n, k]
    group_shape = [n, k // g, 1] if grouped else [n, 1]
    # OpenVINO owns these buffers and the Constants keep them (an ov.Tensor over a numpy array would not keep the
    # array alive); the quantizer writes straight into them, so no second copy of the matrix is ever made.
    codes = ov.Tensor(STORAGE_TYPES[scheme.storage], code_shape)
    scale = ov.Tensor(ov.Type.f16, group_shape)
    zero_point = None if scheme.sym else ov.Tensor(STORAGE_TYPES[f"u{scheme.bits}"], group_shape)
    quantize_into(
        tensor,
        scheme,
        codes.data.reshape(-1),
        scale.data.reshape(-1),
        None if zero_point is None else zero_point.data.reshape(-1),
    )
    return decompressed(codes, scale, zero_point, (n, k), path)


def decompressed(
    codes: ov.Tensor, scale: ov.Tensor, zero_point: ov.Tensor | None, shape: tuple[int, int], path: str
) -> Output:
    """The decompression subgraph over filled code, scale and zero-point buffers of an [N, K] matrix (codes
    [N, K/G, G] when grouped, else [N, K])."""
    n, k = shape
    grouped = len(codes.shape) == 3
    w = named(ops.convert(named(ov.op.Constant(codes), f"{path}/weight/codes"), ov.Type.f16), f"{path}/weight/f16")
    if zero_point is not None:
        zp = named(ov.op.Constant(zero_point), f"{path}/weight/zero_point")
        zp = named(ops.convert(zp, ov.Type.f16), f"{path}/weight/zero_point/f16")
        w = named(ops.subtract(w, zp), f"{path}/weight/centered")
    w = named(ops.multiply(w, named(ov.op.Constant(scale), f"{path}/weight/scale")), f"{path}/weight/scaled")
    if grouped:
        w = named(ops.reshape(w, i64([n, k]), False), f"{path}/weight/ungrouped")  # [N, K/G, G] -> [N, K]
    return named(ops.convert(w, ov.Type.f32), f"{path}/weight")

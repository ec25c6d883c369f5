"""The weight hook: every checkpoint tensor becomes a graph Constant here, so compression plugs in at one place."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import openvino as ov
import openvino.opset16 as ops

from ovbuild.errors import UnsupportedError
from ovbuild.graph.ops import Output, named
from ovbuild.weights.dtypes import CHUNK, STORAGE, convert_into
from ovbuild.weights.tensor import WeightTensor

OV_TYPES = {"f32": ov.Type.f32, "f16": ov.Type.f16, "bf16": ov.Type.bf16}
FLOAT_FORMATS = ("keep", "fp32", "fp16", "bf16")


@dataclass(frozen=True)
class WeightPolicy:
    """How matrices are stored in the IR: `keep` the checkpoint precision, or cast to fp32/fp16/bf16.

    Norm weights and other small vectors always become f32 (they feed fp32 arithmetic and cost nothing).
    `sym`, `group_size` and `all_layers` describe integer compression (int8 / int4) as optimum-cli names them.
    """

    weight_format: str = "keep"
    sym: bool = False
    group_size: int = 128
    all_layers: bool = False

    def __post_init__(self):
        if self.weight_format not in FLOAT_FORMATS:
            raise UnsupportedError(f"weight format '{self.weight_format}' is not one of {', '.join(FLOAT_FORMATS)}")

    def uncompressed(self) -> WeightPolicy:
        """The policy for tensors that are never integer-compressed (Markov heads): float formats pass through."""
        return self if self.weight_format in FLOAT_FORMATS else WeightPolicy()

    def matrix(self, tensor: WeightTensor, path: str, role: str = "linear") -> Output:
        """A [out, in] matrix as an f32-valued node (Constant, plus Convert when stored narrower).

        role: "linear", "embedding" or "lm_head"; compressing policies treat the last two differently.
        """
        stored = self.cast(tensor)
        return stored_constant(stored, path, share=stored is tensor)

    def cast(self, tensor: WeightTensor) -> WeightTensor:
        """The tensor in the precision this policy stores; a converted copy is written into OpenVINO-owned memory."""
        target = {"keep": tensor.dtype, "fp32": "f32", "fp16": "f16", "bf16": "bf16"}[self.weight_format]
        if target == tensor.dtype:
            return tensor
        return WeightTensor(tensor.name, target, converted(tensor, target).data.view(STORAGE[target]))


def converted(tensor: WeightTensor, dtype: str) -> ov.Tensor:
    """A new OpenVINO tensor holding `tensor` in float `dtype`, rounded to nearest even, a chunk at a time.

    OpenVINO's vectorized Convert is exact here and 3-5x faster than numpy, except towards bf16, which it truncates:
    that one goes through numpy. Chunks keep temporaries small and let other threads run in between.
    """
    if tensor.dtype not in OV_TYPES:
        raise UnsupportedError(f"tensor '{tensor.name}' has dtype {tensor.dtype}; weights must be f32, f16 or bf16")
    out = ov.Tensor(OV_TYPES[dtype], list(tensor.shape))
    dest = out.data.view(STORAGE[dtype])
    if dtype == "bf16":
        convert_into(dest, dtype, tensor.array, tensor.dtype)
        return out
    convert = ops.convert(ops.parameter([-1], OV_TYPES[tensor.dtype]), OV_TYPES[dtype])
    src, flat = np.ascontiguousarray(tensor.array).reshape(-1), dest.reshape(-1)
    for begin in range(0, src.size, CHUNK):
        s, d = src[begin : begin + CHUNK], flat[begin : begin + CHUNK]
        convert.evaluate([ov.Tensor(d, [d.size], OV_TYPES[dtype])], [ov.Tensor(s, [s.size], OV_TYPES[tensor.dtype])])
    return out


def stored_constant(tensor: WeightTensor, path: str, share: bool = False) -> Output:
    """Constant holding the tensor as stored, converted to f32 when narrower.

    An array viewing a whole OpenVINO tensor (see `cast`) is shared without a copy. share=True shares any other
    array's memory: only for memory that outlives the model (a checkpoint's mapped file), as OpenVINO keeps no
    reference to a numpy array.
    """
    if tensor.dtype not in OV_TYPES:
        raise UnsupportedError(f"tensor '{tensor.name}' has dtype {tensor.dtype}; weights must be f32, f16 or bf16")
    owner = _openvino_owner(tensor.array)
    if owner is not None:
        c = ov.op.Constant(owner, shared_memory=True)
    else:
        array = np.ascontiguousarray(tensor.array)
        c = ov.op.Constant(ov.Tensor(array, list(array.shape), OV_TYPES[tensor.dtype]), shared_memory=share)
    if tensor.dtype == "f32":
        return named(c, path)
    named(c, f"{path}/weight")
    return named(ops.convert(c, ov.Type.f32), path)


def _openvino_owner(array: np.ndarray) -> ov.Tensor | None:
    """The OpenVINO tensor whose whole memory `array` views, if any."""
    base = array
    while isinstance(base, np.ndarray):
        base = base.base
    if isinstance(base, ov.Tensor) and tuple(base.shape) == array.shape and base.data.ctypes.data == array.ctypes.data:
        return base
    return None


def f32_constant(tensor: WeightTensor, path: str) -> Output:
    """A small tensor (norm weight, bias) as an f32 Constant."""
    return named(ops.constant(np.ascontiguousarray(tensor.to_f32(), np.float32)), path)

"""The weight hook: every checkpoint tensor becomes a graph Constant here, so compression plugs in at one place."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import openvino as ov
import openvino.opset16 as ops

from ovbuild.errors import UnsupportedError
from ovbuild.graph.ops import Output, named
from ovbuild.weights.dtypes import f32_to_bf16
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
        return stored_constant(self.cast(tensor), path)

    def cast(self, tensor: WeightTensor) -> WeightTensor:
        """The tensor in the precision this policy stores."""
        target = {"keep": tensor.dtype, "fp32": "f32", "fp16": "f16", "bf16": "bf16"}[self.weight_format]
        if target == tensor.dtype:
            return tensor
        values = tensor.to_f32()
        array = (
            f32_to_bf16(values) if target == "bf16" else values.astype(np.float16 if target == "f16" else np.float32)
        )
        return WeightTensor(tensor.name, target, array)


def stored_constant(tensor: WeightTensor, path: str) -> Output:
    """Constant holding the tensor as stored (sharing its memory), converted to f32 when narrower."""
    if tensor.dtype not in OV_TYPES:
        raise UnsupportedError(f"tensor '{tensor.name}' has dtype {tensor.dtype}; weights must be f32, f16 or bf16")
    array = np.ascontiguousarray(tensor.array)
    c = ov.op.Constant(ov.Tensor(array, list(array.shape), OV_TYPES[tensor.dtype]), shared_memory=True)
    if tensor.dtype == "f32":
        return named(c, path)
    named(c, f"{path}/weight")
    return named(ops.convert(c, ov.Type.f32), path)


def f32_constant(tensor: WeightTensor, path: str) -> Output:
    """A small tensor (norm weight, bias) as an f32 Constant."""
    return named(ops.constant(np.ascontiguousarray(tensor.to_f32(), np.float32)), path)

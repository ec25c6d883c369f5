"""The weight hook: every checkpoint matrix becomes a graph node here, so compression plugs in at one place."""

from __future__ import annotations

import mmap
from dataclasses import dataclass

import numpy as np
import openvino as ov
import openvino.opset16 as ops

from ovbuild.errors import ConfigError, UnsupportedError
from ovbuild.graph.ops import Output, named
from ovbuild.graph.quantize.decompression import compressed_constant
from ovbuild.graph.quantize.rtn import CHUNK_WEIGHTS, Scheme
from ovbuild.ir import WeightStorage
from ovbuild.weights.dtypes import FLOAT_DTYPES, f32_to_bf16, to_f32
from ovbuild.weights.tensor import WeightTensor

OV_TYPES = {"f32": ov.Type.f32, "f16": ov.Type.f16, "bf16": ov.Type.bf16}
FLOAT_FORMATS = ("keep", "fp32", "fp16", "bf16")
INT_FORMATS = ("int8", "int4")
POLICY_FORMATS = FLOAT_FORMATS + INT_FORMATS  # every storage a WeightPolicy knows
ROLES = ("linear", "embedding", "lm_head")
# Matrices with a side shorter than this (a [1, H] confidence head) stay float: they save nothing worth the error.
MIN_COMPRESSED_SIDE = 16
# What optimum-intel (NNCF) gives the embedding and lm_head under int4 unless all_layers: int8 asymmetric per
# channel, whatever `sym` says ("--sym does not affect backup precision").
INT4_BACKUP = Scheme(bits=8, sym=False)


@dataclass(frozen=True)
class WeightPolicy:
    """How matrices are stored in the IR, as optimum-cli names it: `weight_format` keep / fp32 / fp16 / bf16 /
    int8 / int4, `sym`, `group_size` (int4; -1 = per output channel) and `all_layers`.

    int8 compresses every matrix (linear layers, embedding, lm_head) per output channel; int4 compresses linear
    layers in groups and gives the embedding and lm_head int8 asymmetric unless `all_layers`. Integer formats keep
    small matrices in the checkpoint precision; norm weights always become f32 (`f32_constant`).
    """

    weight_format: str = "keep"
    sym: bool = False
    group_size: int = 128
    all_layers: bool = False

    def __post_init__(self):
        if self.weight_format not in POLICY_FORMATS:
            raise UnsupportedError(f"weight format '{self.weight_format}' is not one of {', '.join(POLICY_FORMATS)}")
        if self.group_size != -1 and self.group_size < 1:
            raise ConfigError(f"group_size {self.group_size}: expected a positive number of inputs, or -1")

    def uncompressed(self) -> WeightPolicy:
        """The policy for tensors that are never integer-compressed (Markov heads): float formats pass through."""
        return self if self.weight_format in FLOAT_FORMATS else WeightPolicy()

    def matrix(self, tensor: WeightTensor, path: str, role: str = "linear") -> Output:
        """A [out, in] matrix as an f32-valued node named `{path}/weight`: a Constant (plus Convert when stored
        narrower), or the decompression subgraph of its integer codes. role: "linear", "embedding" or "lm_head"."""
        scheme = self.scheme(role)
        if scheme is not None and len(tensor.shape) == 2 and min(tensor.shape) >= MIN_COMPRESSED_SIDE:
            return compressed_constant(tensor, scheme, path)
        return stored_constant(tensor, path, self.float_dtype(tensor))

    def scheme(self, role: str) -> Scheme | None:
        """The integer scheme for a matrix of this role, or None when this policy keeps it float."""
        if role not in ROLES:
            raise UnsupportedError(f"weight role '{role}' is not one of {', '.join(ROLES)}")
        if self.weight_format == "int8":
            return Scheme(bits=8, sym=self.sym)
        if self.weight_format == "int4":
            return Scheme(4, self.sym, self.group_size) if role == "linear" or self.all_layers else INT4_BACKUP
        return None

    def float_dtype(self, tensor: WeightTensor) -> str:
        """The precision a matrix kept in float is stored in."""
        return {"fp32": "f32", "fp16": "f16", "bf16": "bf16"}.get(self.weight_format, tensor.dtype)

    def storage(self) -> WeightStorage:
        """How the weights of an IR built with this policy are stored, for its rt_info."""
        if self.weight_format not in INT_FORMATS:
            return WeightStorage(self.weight_format)
        group_size = self.group_size if self.weight_format == "int4" else -1
        return WeightStorage(self.weight_format, self.sym, group_size, self.all_layers)


def stored_constant(tensor: WeightTensor, path: str, dtype: str | None = None) -> Output:
    """Constant holding the tensor in `dtype` (default: as stored), converted to f32 when narrower.

    Stored as is, a checkpoint tensor's Constant shares the mapped file, so the checkpoint must stay open until the
    model is compiled or saved; converted, it is written a few rows at a time into a buffer the Constant owns.
    """
    dtype = dtype or tensor.dtype
    if dtype not in OV_TYPES or tensor.dtype not in FLOAT_DTYPES:
        raise UnsupportedError(
            f"tensor '{tensor.name}' has dtype {tensor.dtype}; weights must be float and stored as f32, f16 or bf16"
        )
    c = shared_constant(tensor) if dtype == tensor.dtype else converted_constant(tensor, dtype)
    if dtype == "f32":
        return named(c, f"{path}/weight")
    named(c, f"{path}/weight/stored")
    return named(ops.convert(c, ov.Type.f32), f"{path}/weight")


def shared_constant(tensor: WeightTensor) -> ov.Node:
    """A Constant over the checkpoint's mapped memory, or over a plugin-owned copy of any other array."""
    array = np.ascontiguousarray(tensor.array)
    if _is_mapped(array):
        return ov.op.Constant(ov.Tensor(array, list(array.shape), OV_TYPES[tensor.dtype]), shared_memory=True)
    # An ov.Tensor over a numpy array does not keep the array alive, so only the mapping (which lives as long as
    # the checkpoint) is shared; anything else is copied into a buffer the Constant owns.
    t = ov.Tensor(OV_TYPES[tensor.dtype], list(array.shape))
    t.data.view(array.dtype)[...] = array
    return ov.op.Constant(t)


def converted_constant(tensor: WeightTensor, dtype: str) -> ov.Node:
    """A Constant of the tensor cast to f32 / f16 (saturating) / bf16, converted a few rows at a time."""
    t = ov.Tensor(OV_TYPES[dtype], list(tensor.shape))
    dest = t.data.view(np.uint16) if dtype == "bf16" else t.data
    rows = max(1, CHUNK_WEIGHTS // max(1, int(np.prod(tensor.shape[1:], dtype=np.int64))))
    for begin in range(0, tensor.shape[0], rows):
        values = to_f32(tensor.array[begin : begin + rows], tensor.dtype)
        if dtype == "bf16":
            dest[begin : begin + rows] = f32_to_bf16(values)
        elif dtype == "f16":
            f16_max = float(np.finfo(np.float16).max)
            dest[begin : begin + rows] = np.clip(values, -f16_max, f16_max).astype(np.float16)
        else:
            dest[begin : begin + rows] = values
    return ov.op.Constant(t)


def _is_mapped(array: np.ndarray) -> bool:
    """Whether the array is a view of a memory-mapped file (a checkpoint tensor read lazily)."""
    base = array
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    return isinstance(base.obj if isinstance(base, memoryview) else base, mmap.mmap)


def f32_constant(tensor: WeightTensor, path: str) -> Output:
    """A small tensor (norm weight, bias) as an f32 Constant."""
    return named(ops.constant(np.ascontiguousarray(tensor.to_f32(), np.float32)), path)

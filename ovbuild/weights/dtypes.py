"""Checkpoint dtypes without torch: bf16 is kept as raw uint16 bits and widened to f32 on demand."""

from __future__ import annotations

import numpy as np

# safetensors dtype code -> (our name, numpy storage dtype). bf16 has no numpy dtype: its bits live in uint16.
SAFETENSORS_DTYPES: dict[str, tuple[str, np.dtype]] = {
    "F64": ("f64", np.dtype("<f8")),
    "F32": ("f32", np.dtype("<f4")),
    "F16": ("f16", np.dtype("<f2")),
    "BF16": ("bf16", np.dtype("<u2")),
    "I64": ("i64", np.dtype("<i8")),
    "I32": ("i32", np.dtype("<i4")),
    "I16": ("i16", np.dtype("<i2")),
    "I8": ("i8", np.dtype("i1")),
    "U8": ("u8", np.dtype("u1")),
    "BOOL": ("bool", np.dtype("?")),
}
DTYPE_CODES = {name: code for code, (name, _) in SAFETENSORS_DTYPES.items()}
FLOAT_DTYPES = ("f32", "f16", "bf16", "f64")
STORAGE = {"f32": np.dtype("<f4"), "f16": np.dtype("<f2"), "bf16": np.dtype("<u2")}  # how float weights sit in numpy
CHUNK = 1 << 22  # elements converted at a time: f32 temporaries stay a few MB, whatever the tensor size


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    """Widen raw bf16 bits (uint16) to float32 exactly: bf16 is the top half of an f32."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(x: np.ndarray) -> np.ndarray:
    """Round float32 to bf16 bits (uint16) to nearest, ties to even, NaN kept NaN."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(x), np.uint16(0x7FC0), rounded)


def to_f32(array: np.ndarray, dtype: str) -> np.ndarray:
    """Any float checkpoint array (bf16 as bits) as float32."""
    if dtype == "bf16":
        return bf16_to_f32(array)
    return np.asarray(array, dtype=np.float32)


def convert_into(out: np.ndarray, out_dtype: str, src: np.ndarray, src_dtype: str) -> np.ndarray:
    """Write float values `src` (bf16 as bits) into `out` in another float dtype, a chunk at a time; returns `out`.

    Chunks keep the f32 intermediate small, where converting a whole embedding table would briefly need 3x its size.
    """
    flat_src, flat_out = src.reshape(-1), out.reshape(-1)
    for begin in range(0, flat_src.size, CHUNK):
        values = to_f32(flat_src[begin : begin + CHUNK], src_dtype)
        flat_out[begin : begin + CHUNK] = f32_to_bf16(values) if out_dtype == "bf16" else values
    return out

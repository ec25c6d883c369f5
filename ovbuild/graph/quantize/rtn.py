"""Round-to-nearest weight quantization in numpy, one [N, K] matrix at a time, a few rows at a time.

Each output row is cut into groups of G inputs (G = K: one group per output channel); every group gets an f16 scale
and, when asymmetric, an unsigned zero point, so that w ~ (code - zero_point) * scale, computed in f32 (exact there:
a code of at most 9 bits times an 11-bit f16 mantissa fits f32's 24 bits, which is how the plugins decompress).

- asymmetric (u8 / u4): the group's range [min(w, 0), max(w, 0)] spread over 2^b - 1 steps; zero stays exact.
- symmetric (i8 / i4): scale = -w_extreme / 2^(b-1), w_extreme the group's value of largest magnitude with its sign,
  so the extreme lands on -2^(b-1) and the full signed range is used (values beyond +(2^(b-1) - 1) clip by at most
  one step); the scale may therefore be negative.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ovbuild.errors import ConfigError
from ovbuild.graph.quantize.nibbles import pack_nibbles, packed_size, unpack_nibbles
from ovbuild.weights.dtypes import to_f32
from ovbuild.weights.tensor import WeightTensor

# Smallest normal f16: smaller scales would be subnormal, which kernels may flush to zero.
MIN_SCALE = float(np.finfo(np.float16).tiny)
# Rows are quantized in chunks of about this many weights, so an embedding table never exists in f32 at once.
CHUNK_WEIGHTS = 1 << 22


@dataclass(frozen=True)
class Scheme:
    """How a matrix is stored: `bits` 8 or 4, symmetric or not, `group_size` inputs per scale (-1: whole row)."""

    bits: int
    sym: bool
    group_size: int = -1

    @property
    def storage(self) -> str:
        """Element type of the codes: u8 / i8 / u4 / i4."""
        return f"{'i' if self.sym else 'u'}{self.bits}"

    def group_length(self, in_features: int, name: str) -> int:
        """G for a matrix with `in_features` inputs; a group size that does not divide it is an error."""
        if self.group_size == -1:
            return in_features
        if in_features % self.group_size:
            divisor = in_features & -in_features  # largest power of two dividing in_features
            raise ConfigError(
                f"tensor '{name}': group_size {self.group_size} does not divide its {in_features} inputs; "
                f"use group_size -1 (one group per output channel) or a divisor such as {divisor}"
            )
        return self.group_size


@dataclass(frozen=True)
class Quantized:
    """One [N, K] matrix as stored, every array flat in row-major [N, K/G, G] order.

    codes: uint8 / int8 per weight for 8 bits; for 4 bits uint8 bytes packed two per byte (see `nibbles`).
    scale: f16 [N * K/G]. zero_point (asymmetric only): stored like the codes, one per group.
    """

    scheme: Scheme
    shape: tuple[int, int]
    group: int
    codes: np.ndarray
    scale: np.ndarray
    zero_point: np.ndarray | None


def quantize(tensor: WeightTensor, scheme: Scheme) -> Quantized:
    """Quantize a [N, K] checkpoint matrix into freshly allocated numpy arrays."""
    n, k = tensor.shape
    g = scheme.group_length(k, tensor.name)
    codes, scale, zero_point = storage_arrays(scheme, n * k, n * (k // g))
    quantize_into(tensor, scheme, codes, scale, zero_point)
    return Quantized(scheme, (n, k), g, codes, scale, zero_point)


def storage_arrays(scheme: Scheme, weights: int, groups: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Empty flat (codes, scale, zero_point) arrays for `weights` weights in `groups` groups."""
    if scheme.bits == 4:
        codes = np.empty(packed_size(weights), np.uint8)
        zero_point = None if scheme.sym else np.empty(packed_size(groups), np.uint8)
    else:
        codes = np.empty(weights, np.int8 if scheme.sym else np.uint8)
        zero_point = None if scheme.sym else np.empty(groups, np.uint8)
    return codes, np.empty(groups, np.float16), zero_point


def quantize_into(
    tensor: WeightTensor, scheme: Scheme, codes: np.ndarray, scale: np.ndarray, zero_point: np.ndarray | None
) -> None:
    """Quantize a [N, K] matrix chunk by chunk into flat destination arrays (laid out as `Quantized` describes)."""
    n, k = tensor.shape
    g = scheme.group_length(k, tensor.name)
    per_row = k // g
    rows = max(2, (CHUNK_WEIGHTS // k) & ~1)  # even, so a chunk of 4-bit codes starts on a byte boundary
    for begin in range(0, n, rows):
        end = min(begin + rows, n)
        w = to_f32(tensor.array[begin:end], tensor.dtype).reshape(end - begin, per_row, g)  # [r, K/G, G]
        q, s, z = quantize_groups(w, scheme)
        store(codes, begin * k, q, scheme.bits)
        scale[begin * per_row : end * per_row] = s.ravel()
        if z is not None:
            store(zero_point, begin * per_row, z, scheme.bits)


def quantize_groups(w: np.ndarray, scheme: Scheme) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """w [r, groups, G] f32 -> codes [r, groups, G] (uint8 / int8), scale f16 [r, groups], zero point uint8 or None."""
    if scheme.sym:
        low, high = -(1 << (scheme.bits - 1)), (1 << (scheme.bits - 1)) - 1
        extreme = np.take_along_axis(w, np.abs(w).argmax(-1)[..., None], -1)[..., 0]
        scale = f16_scale(extreme / low)
        codes = np.clip(np.rint(w / scale.astype(np.float32)[..., None]), low, high).astype(np.int8)
        return codes, scale, None
    top = (1 << scheme.bits) - 1
    lo, hi = np.minimum(w.min(-1), 0.0), np.maximum(w.max(-1), 0.0)
    scale = f16_scale((hi - lo) / top)
    s = scale.astype(np.float32)
    zero_point = np.clip(np.rint(-lo / s), 0, top)
    codes = np.clip(np.rint(w / s[..., None]) + zero_point[..., None], 0, top).astype(np.uint8)
    return codes, scale, zero_point.astype(np.uint8)


def f16_scale(scale: np.ndarray) -> np.ndarray:
    """Scales rounded to f16, magnitudes raised to MIN_SCALE (sign kept; an all-zero group gets +MIN_SCALE)."""
    s = scale.astype(np.float16)
    small = np.abs(s) < MIN_SCALE
    return np.where(small, np.where(s < 0, -MIN_SCALE, MIN_SCALE), s).astype(np.float16)


def store(dest: np.ndarray, offset: int, values: np.ndarray, bits: int) -> None:
    """Write `values` (flattened) at element `offset` of a flat destination; 4-bit offsets must be even."""
    flat = values.ravel()
    if bits == 8:
        dest[offset : offset + flat.size] = flat
        return
    packed = pack_nibbles(flat)
    dest.view(np.uint8)[offset // 2 : offset // 2 + packed.size] = packed


def dequantize(q: Quantized) -> np.ndarray:
    """The f32 [N, K] matrix the plugins compute from `q`: (code - zero_point) * scale, evaluated in f32."""
    n, k = q.shape
    groups = n * (k // q.group)
    signed = q.scheme.sym
    codes = unpack_nibbles(q.codes, n * k, signed) if q.scheme.bits == 4 else q.codes
    values = codes.astype(np.float32).reshape(groups, q.group)
    if q.zero_point is not None:
        zp = unpack_nibbles(q.zero_point, groups, False) if q.scheme.bits == 4 else q.zero_point
        values = values - zp.astype(np.float32)[:, None]
    return (values * q.scale.astype(np.float32)[:, None]).reshape(n, k)

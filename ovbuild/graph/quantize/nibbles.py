"""u4 / i4 storage as OpenVINO lays it out: two values per byte, element 2j in the low nibble of byte j, element
2j + 1 in the high nibble; i4 is the two's complement nibble; an odd count leaves the last high nibble zero."""

from __future__ import annotations

import numpy as np


def packed_size(count: int) -> int:
    """Bytes holding `count` 4-bit values."""
    return (count + 1) // 2


def pack_nibbles(values: np.ndarray) -> np.ndarray:
    """Integers in [-8, 15] (u4 codes 0..15 or i4 codes -8..7), any shape, flattened -> uint8 [ceil(n / 2)]."""
    flat = np.asarray(values).ravel().astype(np.uint8) & 0xF  # negative i4 codes wrap to their two's complement
    if flat.size % 2:
        flat = np.append(flat, np.uint8(0))
    return flat[0::2] | (flat[1::2] << 4)


def unpack_nibbles(packed: np.ndarray, count: int, signed: bool) -> np.ndarray:
    """uint8 [ceil(count / 2)] -> the first `count` values as int8 (u4: 0..15, i4: -8..7)."""
    raw = np.asarray(packed).view(np.uint8).ravel()
    values = np.empty(2 * raw.size, np.int8)
    values[0::2] = raw & 0xF
    values[1::2] = raw >> 4
    values = values[:count]
    return np.where(values >= 8, values - 16, values).astype(np.int8) if signed else values

"""WeightTensor: one checkpoint tensor as stored (bf16 as raw bits), with its name for error messages."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ovbuild.weights.dtypes import to_f32


@dataclass(frozen=True)
class WeightTensor:
    """A tensor read from a checkpoint: `array` holds the stored values (uint16 bits for bf16), often an mmap view."""

    name: str
    dtype: str  # "f32" | "f16" | "bf16" | ...
    array: np.ndarray

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.array.shape)

    def to_f32(self) -> np.ndarray:
        """The values as a float32 array (a copy for bf16/f16)."""
        return to_f32(self.array, self.dtype)

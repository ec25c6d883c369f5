"""Multi-axis RoPE (Qwen3.5 / MiniCPM-V 4.7 `mrope_section`, `mrope_interleaved`) in numpy, as transformers defines
it: each rotary frequency i takes its angle from one of three position axes (temporal, height, width).

- not interleaved: the frequencies are cut into consecutive sections of `mrope_section` lengths, section a using
  axis a;
- interleaved: frequency i uses axis 1 when i % 3 == 1 and i < 3 · section[1], axis 2 when i % 3 == 2 and
  i < 3 · section[2], axis 0 otherwise.

Text tokens carry the same index on all three axes, which makes every choice the same angle: plain RoPE. ovbuild's
graphs therefore run plain RoPE; tests/test_mrope.py proves the reduction with this module.
"""

from __future__ import annotations

import numpy as np


def mrope_axes(section: tuple[int, ...], interleaved: bool) -> np.ndarray:
    """The position axis (0, 1 or 2) of each of the sum(section) rotary frequencies."""
    n = sum(section)
    if not interleaved:
        return np.repeat(np.arange(len(section)), section)
    axes = np.zeros(n, np.int64)
    for axis in (1, 2):
        axes[axis : 3 * section[axis] : 3] = axis
    return axes


def mrope_angles(
    positions: np.ndarray, inv_freq: np.ndarray, section: tuple[int, ...], interleaved: bool
) -> np.ndarray:
    """Angles [n, F] of rows with positions [3, n] (one index per axis) over inverse frequencies [F]."""
    if sum(section) != len(inv_freq):
        raise ValueError(f"mrope_section {list(section)} does not cover {len(inv_freq)} rotary frequencies")
    per_axis = positions.astype(np.float64)[:, :, None] * inv_freq[None, None, :]  # [3, n, F]
    axes = mrope_axes(section, interleaved)
    return np.take_along_axis(per_axis, axes[None, None, :].repeat(per_axis.shape[1], 1), 0)[0]

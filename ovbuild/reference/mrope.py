"""Multi-axis RoPE (Qwen3.5 / MiniCPM-V 4.7 `mrope_section`, `mrope_interleaved`) in numpy, as transformers defines
it: each rotary frequency i takes its angle from one of three position axes (temporal, height, width).

- not interleaved: the frequencies are cut into consecutive sections of `mrope_section` lengths, section a using
  axis a;
- interleaved: frequency i uses axis 1 when i % 3 == 1 and i < 3 · section[1], axis 2 when i % 3 == 2 and
  i < 3 · section[2], axis 0 otherwise.

Text tokens carry the same index on all three axes, which makes every choice the same angle: plain RoPE
(tests/test_mrope.py proves the reduction with this module). Image tokens do not: a target that takes images turns
each frequency by its own axis (`mrope`), the reference of graph/rope.py's mrope_tables. Formulas: docs/vision.md.
"""

from __future__ import annotations

import numpy as np

from ovbuild.reference.rope import ReferenceRope


def mrope_axes(section: tuple[int, ...], interleaved: bool, n: int | None = None) -> np.ndarray:
    """The position axis (0, 1 or 2) of each of the n rotary frequencies (default sum(section)). Interleaved, axis a
    takes every third frequency from a while below 3 · section[a], cut at n as transformers' slices are."""
    n = sum(section) if n is None else n
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
    if not interleaved and sum(section) != len(inv_freq):
        raise ValueError(f"mrope_section {list(section)} does not cover {len(inv_freq)} rotary frequencies")
    per_axis = positions.astype(np.float64)[:, :, None] * inv_freq[None, None, :]  # [3, n, F]
    axes = mrope_axes(section, interleaved, len(inv_freq))
    return np.take_along_axis(per_axis, axes[None, None, :].repeat(per_axis.shape[1], 1), 0)[0]


def mrope(x: np.ndarray, positions: np.ndarray, r: ReferenceRope, section: tuple[int, ...], interleaved: bool):
    """Neox-style rotary embedding with multi-axis angles. x: [n, heads, head_dim], positions: [3, n]."""
    d = x.shape[-1]
    angles = mrope_angles(positions, r.inv_freq, section, interleaved)  # [n, d/2]
    cos = np.cos(np.concatenate([angles, angles], -1))[:, None] * r.attention_factor  # [n, 1, d]
    sin = np.sin(np.concatenate([angles, angles], -1))[:, None] * r.attention_factor
    rotated = np.concatenate([-x[..., d // 2 :], x[..., : d // 2]], -1)
    return x * cos + rotated * sin

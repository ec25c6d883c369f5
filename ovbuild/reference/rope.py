"""RoPE frequencies of the reference, computed from config.json's own values as transformers defines them.

Deliberately a second implementation: the graph builders take theirs from ovbuild.weights.rope, so a mistake in either
shows up as a parity failure. The formulas are written out in docs/reference_rope.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ReferenceRope:
    """Inverse frequencies [head_dim / 2] (float64) and the factor on both cos and sin (yarn's attention factor)."""

    inv_freq: np.ndarray
    attention_factor: float = 1.0


def rope_from_config(config: dict, head_dim: int) -> ReferenceRope:
    """RoPE of a Hugging Face config dict: `rope_parameters` (transformers 5) or `rope_theta` + `rope_scaling`."""
    params = config.get("rope_parameters") or {}
    if "rope_theta" in params:
        theta, scaling = float(params["rope_theta"]), params
    else:
        theta, scaling = float(config.get("rope_theta", 10000.0)), config.get("rope_scaling") or {}
    kind = scaling.get("rope_type") or scaling.get("type") or "default"
    exponents = np.array([2 * i / head_dim for i in range(head_dim // 2)], np.float64)  # 2i / d
    unscaled = np.power(theta, -exponents)  # theta^(-2i/d)
    if kind == "default":
        return ReferenceRope(unscaled)
    if kind == "linear":
        return ReferenceRope(unscaled / float(scaling["factor"]))  # positions divided by the factor
    original = scaling.get("original_max_position_embeddings") or config["max_position_embeddings"]
    if kind == "yarn":
        return _yarn(unscaled, theta, head_dim, scaling, float(original), config)
    if kind == "llama3":
        return ReferenceRope(_llama3(unscaled, scaling, float(original)))
    raise ValueError(f"the reference has no RoPE of type {kind!r}")


def _yarn(unscaled: np.ndarray, theta: float, dim: int, s: dict, original: float, config: dict) -> ReferenceRope:
    """YaRN: dimensions that turn fewer than beta_slow times over the original context are interpolated (frequency
    divided by the factor), those turning more than beta_fast times kept, a linear ramp between; cos/sin scaled."""
    factor = s.get("factor")
    factor = float(factor) if factor is not None else config["max_position_embeddings"] / original
    beta_fast, beta_slow = float(s.get("beta_fast") or 32), float(s.get("beta_slow") or 1)

    def dimension_turning(turns: float) -> float:
        # dimension index whose wavelength fits `turns` times into the original context
        return dim * math.log(original / (turns * 2 * math.pi)) / (2 * math.log(theta))

    low, high = dimension_turning(beta_fast), dimension_turning(beta_slow)
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if high == low:
        high = high + 0.001
    kept = np.array([1.0 - min(max((i - low) / (high - low), 0.0), 1.0) for i in range(dim // 2)])
    inv_freq = kept * unscaled + (1.0 - kept) * unscaled / factor
    attention_factor = s.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all_dim = s.get("mscale"), s.get("mscale_all_dim")

        def magnitude(m: float) -> float:
            return 1.0 if factor <= 1 else 1.0 + 0.1 * m * math.log(factor)

        attention_factor = magnitude(mscale) / magnitude(mscale_all_dim) if mscale and mscale_all_dim else magnitude(1)
    return ReferenceRope(inv_freq, float(attention_factor))


def _llama3(unscaled: np.ndarray, s: dict, original: float) -> np.ndarray:
    """Llama 3.1: long wavelengths (beyond original / low_freq_factor) divided by the factor, short ones (below
    original / high_freq_factor) kept, a smooth blend between, linear in original / wavelength."""
    factor, low, high = float(s["factor"]), float(s["low_freq_factor"]), float(s["high_freq_factor"])
    out = np.empty_like(unscaled)
    for i, f in enumerate(unscaled):
        wavelength = 2 * math.pi / f
        if wavelength < original / high:
            out[i] = f
        elif wavelength > original / low:
            out[i] = f / factor
        else:
            blend = (original / wavelength - low) / (high - low)
            out[i] = (1 - blend) * f / factor + blend * f
    return out

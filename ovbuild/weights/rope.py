"""RoPE frequencies from `rope_theta`, `rope_scaling` or `rope_parameters`, as transformers computes them."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ovbuild.errors import ConfigError, UnsupportedError
from ovbuild.weights.config_reader import ConfigReader

SUPPORTED_ROPE_TYPES = ("default", "linear", "yarn", "llama3")


@dataclass(frozen=True)
class RopeConfig:
    """RoPE parameters; `inv_freq(head_dim)` and `attention_scaling` are what graphs and references use."""

    theta: float
    rope_type: str = "default"
    factor: float = 1.0
    original_max_position_embeddings: int = 0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    attention_factor: float | None = None
    mscale: float = 0.0
    mscale_all_dim: float = 0.0
    truncate: bool = True

    def inv_freq(self, head_dim: int) -> np.ndarray:
        """[head_dim / 2] float64 inverse frequencies."""
        base = 1.0 / self.theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
        if self.rope_type == "linear":
            return base / self.factor
        if self.rope_type == "yarn":
            return self._yarn_inv_freq(base, head_dim)
        if self.rope_type == "llama3":
            return self._llama3_inv_freq(base)
        return base

    @property
    def attention_scaling(self) -> float:
        """Factor on cos and sin (yarn's mscale; 1 otherwise)."""
        if self.rope_type != "yarn":
            return 1.0
        if self.attention_factor is not None:
            return self.attention_factor

        def get_mscale(scale: float, m: float = 1.0) -> float:
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        if self.mscale and self.mscale_all_dim:
            return get_mscale(self.factor, self.mscale) / get_mscale(self.factor, self.mscale_all_dim)
        return get_mscale(self.factor)

    def _yarn_inv_freq(self, extrapolation: np.ndarray, dim: int) -> np.ndarray:
        def correction_dim(rotations: float) -> float:
            max_pos = self.original_max_position_embeddings
            return dim * math.log(max_pos / (rotations * 2 * math.pi)) / (2 * math.log(self.theta))

        low, high = correction_dim(self.beta_fast), correction_dim(self.beta_slow)
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001
        ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
        extrapolation_weight = 1 - ramp
        return extrapolation / self.factor * (1 - extrapolation_weight) + extrapolation * extrapolation_weight

    def _llama3_inv_freq(self, inv_freq: np.ndarray) -> np.ndarray:
        old_len = self.original_max_position_embeddings
        low_wavelen, high_wavelen = old_len / self.low_freq_factor, old_len / self.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = np.where(wavelen > low_wavelen, inv_freq / self.factor, inv_freq)
        smooth = (old_len / wavelen - self.low_freq_factor) / (self.high_freq_factor - self.low_freq_factor)
        smoothed = (1 - smooth) * scaled / self.factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return np.where(medium, smoothed, scaled)


def parse_rope(r: ConfigReader) -> RopeConfig:
    """Read `rope_parameters` (transformers 5) or `rope_theta` + `rope_scaling` (older configs)."""
    params = r.section("rope_parameters")
    scaling = r.section("rope_scaling")
    if params is not None and params.has("rope_theta"):
        theta, s = params.float("rope_theta"), params
    else:
        theta, s = r.float("rope_theta", 10000.0), scaling
    if s is None:
        return RopeConfig(theta=theta)
    # older configs name the type `type`; reading `rope_type` with no default there used to raise
    rope_type = s.str("rope_type") if s.has("rope_type") else s.str("type", "default")
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise UnsupportedError(
            f"{s.where('rope_type')}: rope type '{rope_type}' is not supported "
            f"(supported: {', '.join(SUPPORTED_ROPE_TYPES)})"
        )
    if s.float("partial_rotary_factor", 1.0) != 1.0:
        raise UnsupportedError(f"{s.where('partial_rotary_factor')}: partial rotary embeddings are not supported")
    original = 0
    if rope_type in ("yarn", "llama3"):
        original = s.int("original_max_position_embeddings", None) or r.int("max_position_embeddings", 0)
        if not original:
            raise UnsupportedError(f"{s.where('original_max_position_embeddings')} is needed for {rope_type} rope")
    return RopeConfig(
        theta=theta,
        rope_type=rope_type,
        factor=scaling_factor(s, r, rope_type, original),
        original_max_position_embeddings=original,
        beta_fast=s.float("beta_fast", 32.0),
        beta_slow=s.float("beta_slow", 1.0),
        low_freq_factor=s.float("low_freq_factor", 1.0),
        high_freq_factor=s.float("high_freq_factor", 4.0),
        attention_factor=s.float("attention_factor", None),
        mscale=s.float("mscale", 0.0),
        mscale_all_dim=s.float("mscale_all_dim", 0.0),
        truncate=s.bool("truncate", True),
    )


def scaling_factor(s: ConfigReader, r: ConfigReader, rope_type: str, original: int) -> float:
    """`factor` of a scaled rope. YaRN without one stretches the original length to max_position_embeddings (as
    transformers derives it); the other scaled types cannot guess it."""
    if s.has("factor"):
        return s.float("factor")
    if rope_type == "yarn":
        return r.int("max_position_embeddings", original) / original
    if rope_type in ("linear", "llama3"):
        raise ConfigError(f"{s.where('factor')} is needed for {rope_type} rope")
    return 1.0

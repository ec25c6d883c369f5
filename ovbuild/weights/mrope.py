"""Multi-axis RoPE of a vision-language model's language model: which position axis each rotary frequency reads.

Qwen3.5-family configs (and MiniCPM-V 4.7's, whose language model is one) write `mrope_section` (frequencies per
axis: temporal, height, width) and `mrope_interleaved` under `rope_parameters`. The formulas: docs/vision.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ovbuild.errors import ConfigError
from ovbuild.weights.config_reader import ConfigReader

# transformers' Qwen3.5 rotary embedding when a config names no section
DEFAULT_MROPE_SECTION = (11, 11, 10)


@dataclass(frozen=True)
class MropeSpec:
    """Three-axis RoPE: `section[a]` frequencies take axis a's position; interleaved spreads axes 1 and 2 over every
    third frequency instead of consecutive runs."""

    section: tuple[int, int, int]
    interleaved: bool
    frequencies: int  # rotary_dim / 2

    def axes(self) -> np.ndarray:
        """The position axis (0, 1 or 2) of each rotary frequency: [frequencies] i64."""
        if not self.interleaved:
            return np.repeat(np.arange(3), self.section).astype(np.int64)
        axes = np.zeros(self.frequencies, np.int64)  # transformers slices [a : 3 s_a : 3], cut at the last frequency
        for axis in (1, 2):
            axes[axis : 3 * self.section[axis] : 3] = axis
        return axes


def parse_mrope(params: ConfigReader | None, rotary_dim: int) -> MropeSpec:
    """The multi-axis RoPE of `rope_parameters` (or `rope_scaling`). Consecutive sections must cover the rotary_dim / 2
    frequencies; interleaved ones are laid over them as transformers does, whatever their sum."""
    if params is None:
        section, interleaved = DEFAULT_MROPE_SECTION, True
    else:
        section = tuple(params.int_list("mrope_section", DEFAULT_MROPE_SECTION))
        interleaved = params.bool("mrope_interleaved", True)
    where = params.where("mrope_section") if params is not None else "mrope_section (default)"
    if len(section) != 3 or min(section) < 0 or (not interleaved and sum(section) != rotary_dim // 2):
        raise ConfigError(f"{where} = {list(section)} must be 3 counts summing to {rotary_dim // 2} rotary frequencies")
    return MropeSpec(section, interleaved, rotary_dim // 2)

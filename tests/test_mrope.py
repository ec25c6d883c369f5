"""Multi-axis RoPE with text positions (every axis the same index) is plain RoPE, interleaved or not: the reason the
Qwen3.5-family and MiniCPM-V 4.7 graphs run ordinary RoPE on text."""

from __future__ import annotations

import numpy as np
import pytest

from ovbuild.reference.mrope import mrope_angles, mrope_axes
from ovbuild.reference.rope import rope_from_config
from ovbuild.testing.tiny_hybrid import TINY_HYBRID_TEXT

# (mrope_section, rotary dims): the tiny checkpoints', and Qwen3.5's published [11, 11, 10] over 64 rotary dims
SECTIONS = [((1, 1, 2), 8), ((11, 11, 10), 64), ((24, 20, 20), 128)]


def test_axes_by_hand():
    assert mrope_axes((2, 1, 1), False).tolist() == [0, 0, 1, 2]
    assert mrope_axes((1, 1, 2), True).tolist() == [0, 1, 2, 0]
    assert mrope_axes((3, 2, 2), True).tolist() == [0, 1, 2, 0, 1, 2, 0]


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize(("section", "rotary_dim"), SECTIONS)
def test_equal_axes_give_plain_rope(section, rotary_dim, interleaved):
    inv_freq = rope_from_config(TINY_HYBRID_TEXT, rotary_dim).inv_freq
    positions = np.array([0, 1, 7, 300, 4095, 131071])
    plain = positions[:, None].astype(np.float64) * inv_freq[None]  # [n, F]: what the graphs compute
    same = mrope_angles(np.stack([positions] * 3), inv_freq, section, interleaved)
    assert np.array_equal(same, plain)
    # not vacuous: positions differing between axes (an image's height and width) change the angles
    spatial = mrope_angles(np.stack([positions, positions + 3, positions + 5]), inv_freq, section, interleaved)
    assert not np.array_equal(spatial, plain)
    assert np.array_equal(
        spatial[:, mrope_axes(section, interleaved) == 0], plain[:, mrope_axes(section, interleaved) == 0]
    )


def test_a_section_that_does_not_cover_the_frequencies_is_refused():
    with pytest.raises(ValueError, match="does not cover"):
        mrope_angles(np.zeros((3, 1)), np.ones(8), (1, 1, 1), False)


def test_interleaved_sections_are_cut_at_the_last_frequency():
    # transformers' Qwen3.5 default [11, 11, 10] over 4 frequencies: its slices [1:33:3] and [2:30:3] stop at 4
    assert mrope_axes((11, 11, 10), True, 4).tolist() == [0, 1, 2, 0]

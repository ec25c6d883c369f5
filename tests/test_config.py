"""Normalized configs: published key layouts, and a clear error naming file and key for every bad config."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from ovbuild.errors import ConfigError, UnsupportedError
from ovbuild.families import detect_layout
from ovbuild.targets import parse_target_config
from ovbuild.testing import TINY_DRAFT, TINY_TARGET
from ovbuild.weights.draft_config import default_target_layer_ids
from ovbuild.weights.rope import RopeConfig


def draft_config(**changes):
    from ovbuild.weights.config_reader import ConfigReader

    cfg = copy.deepcopy(TINY_DRAFT)
    nested = changes.pop("dflash_config", None)
    cfg.update(changes)
    if nested is not None:
        cfg["dflash_config"] = nested
    layout = detect_layout(cfg, "draft/config.json")
    return layout.parse(ConfigReader(cfg, "draft/config.json"))


def test_tiny_draft_normalizes_like_a_z_lab_checkpoint():
    cfg = draft_config()
    assert (cfg.family, cfg.block_size, cfg.mask_token_id, cfg.target_layer_ids) == ("dflash", 8, 257, (1, 3, 5))
    assert cfg.head_dim * cfg.num_heads != cfg.hidden_size
    assert cfg.layer_causal == (False, False) and cfg.candidate_offset == 1 and cfg.num_candidates == 7


def test_block_size_flat_in_older_checkpoints_and_nested_wins():
    nested = {"mask_token_id": 257, "target_layer_ids": [1, 3, 5]}
    assert draft_config(block_size=4, dflash_config=nested).block_size == 4
    assert draft_config(dflash_config={**nested, "block_size": 16}).block_size == 16
    assert draft_config(dflash_config=nested).block_size == 16  # z-lab's default


def test_conflicting_flat_and_nested_key_is_an_error():
    with pytest.raises(
        ConfigError,
        match=r"draft/config.json: key 'block_size' = 4 conflicts with "
        r"'dflash_config.block_size' = 8",
    ):
        draft_config(block_size=4)


@pytest.mark.parametrize(
    "ids, message",
    [
        ([], "'dflash_config.target_layer_ids' is empty"),
        ([1, 6], r"'dflash_config.target_layer_ids' = \[1, 6\]: 6 is out of range \[0, 6\)"),
        ([-1, 2], "-1 is out of range"),
        ([2, 2], "has duplicates"),
    ],
)
def test_bad_target_layer_ids(ids, message):
    with pytest.raises(ConfigError, match=message):
        draft_config(dflash_config={"mask_token_id": 257, "target_layer_ids": ids, "block_size": 8})


def test_default_taps_follow_z_lab():
    assert default_target_layer_ids(36, 5) == (1, 9, 17, 25, 33)
    cfg = draft_config(dflash_config={"mask_token_id": 257, "block_size": 8})
    assert cfg.target_layer_ids == (1, 3)


@pytest.mark.parametrize("key", ["hidden_size", "num_hidden_layers", "vocab_size", "num_attention_heads"])
def test_missing_config_key_is_named(key):
    cfg = copy.deepcopy(TINY_TARGET)
    del cfg[key]
    with pytest.raises(ConfigError, match=f"target/config.json: key '{key}' is missing"):
        parse_target_config(cfg, "target/config.json")


def test_missing_mask_token_is_named():
    with pytest.raises(ConfigError, match="key 'mask_token_id' is missing"):
        draft_config(dflash_config={"target_layer_ids": [1], "block_size": 8})


def test_wrong_type_is_named():
    with pytest.raises(ConfigError, match="key 'hidden_size' must be an integer"):
        parse_target_config({**TINY_TARGET, "hidden_size": "64"}, "target/config.json")


def test_unknown_architectures_are_refused():
    with pytest.raises(UnsupportedError, match="unknown draft architecture 'EagleDraft'"):
        detect_layout({**TINY_DRAFT, "architectures": ["EagleDraft"]}, "d/config.json")
    with pytest.raises(UnsupportedError, match="unknown target architecture 'LlamaForCausalLM'"):
        parse_target_config({**TINY_TARGET, "architectures": ["LlamaForCausalLM"]}, "t/config.json")


def test_window_applies_only_with_use_sliding_window():
    types = ["sliding_attention", "full_attention"]
    off = draft_config(layer_types=types, sliding_window=12)
    on = draft_config(layer_types=types, sliding_window=12, use_sliding_window=True)
    assert off.sliding_windows == (0, 0) and on.sliding_windows == (12, 0)
    assert on.layer_causal == (True, False)
    assert draft_config(layer_types=types, is_causal=False).layer_causal == (False, False)


def test_rope_parameters_and_legacy_rope_theta_agree():
    legacy = parse_target_config({**TINY_TARGET, "rope_theta": 1e6}, "t")
    new = parse_target_config(
        {**TINY_TARGET, "rope_theta": None, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}, "t"
    )
    assert legacy.rope == new.rope == RopeConfig(theta=1e6)


def test_yarn_rope_keeps_high_frequencies_and_scales_low_ones():
    yarn = RopeConfig(theta=1e6, rope_type="yarn", factor=4.0, original_max_position_embeddings=4096)
    base = RopeConfig(theta=1e6).inv_freq(128)
    inv = yarn.inv_freq(128)
    assert inv[0] == base[0] and np.isclose(inv[-1], base[-1] / 4)
    assert np.isclose(yarn.attention_scaling, 0.1 * np.log(4) + 1)


def test_unsupported_rope_type_is_refused():
    with pytest.raises(UnsupportedError, match="rope type 'dynamic' is not supported"):
        parse_target_config({**TINY_TARGET, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "t")


def test_a_scaled_rope_without_its_factor_is_refused():
    for scaling in ({"rope_type": "linear"}, {"rope_type": "llama3", "original_max_position_embeddings": 64}):
        with pytest.raises(ConfigError, match=r"t: key 'rope_scaling\.factor' is needed"):
            parse_target_config({**TINY_TARGET, "rope_scaling": scaling}, "t")

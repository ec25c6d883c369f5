"""Qwen3DSparkModel configs: DSpark and DeepSpec DFlash keys read as DeepSpec writes them, clear errors otherwise."""

from __future__ import annotations

import pytest

from ovbuild.errors import ConfigError, UnsupportedError
from ovbuild.families import detect_layout
from ovbuild.testing import DSPARK_KINDS, TINY_DSPARK
from ovbuild.weights.config_reader import ConfigReader


def dspark_config(kind: str = "vanilla", drop: tuple[str, ...] = (), **changes):
    cfg = {**TINY_DSPARK, **DSPARK_KINDS[kind], **changes}
    for key in drop:
        cfg.pop(key)
    layout = detect_layout(cfg, "dspark/config.json")
    return layout.parse(ConfigReader(cfg, "dspark/config.json"))


def test_dspark_normalizes_with_candidate_offset_zero():
    cfg = dspark_config("gated")
    assert (cfg.family, cfg.block_size, cfg.mask_token_id, cfg.target_layer_ids) == ("dspark", 7, 257, (1, 3, 4))
    assert cfg.candidate_offset == 0 and cfg.num_candidates == 7  # the anchor row is the first prediction row
    assert (cfg.markov_rank, cfg.markov_head_type) == (16, "gated")
    assert cfg.enable_confidence_head and cfg.confidence_head_with_markov and cfg.confidence_width == 64 + 16
    assert cfg.layer_causal == (False, False)


def test_deepspec_dflash_is_rank_zero_without_heads():
    cfg = dspark_config("deepspec_dflash", drop=("markov_head_type", "confidence_head_with_markov"))
    assert (cfg.family, cfg.markov_rank, cfg.markov_head_type) == ("dspark", 0, None)
    assert not cfg.enable_confidence_head and not cfg.confidence_head_with_markov
    assert cfg.num_candidates == cfg.block_size == 7


def test_keys_the_authors_omit_are_not_read():
    """markov_head_type only counts when markov_rank > 0, confidence_head_with_markov only with a confidence head."""
    cfg = dspark_config("deepspec_dflash", markov_head_type="rnn", confidence_head_with_markov="not a bool")
    assert cfg.markov_head_type is None and not cfg.confidence_head_with_markov


def test_rnn_head_is_refused_with_the_reason():
    with pytest.raises(UnsupportedError, match=r"key 'markov_head_type' = 'rnn' is not supported: .*whole path"):
        dspark_config(markov_head_type="rnn")


@pytest.mark.parametrize(
    "changes, drop, message",
    [
        ({"markov_head_type": "linear"}, (), r"key 'markov_head_type' = 'linear' is not one of vanilla, gated, rnn"),
        ({}, ("markov_rank",), r"dspark/config.json: key 'markov_rank' is missing"),
        ({"markov_rank": -1}, (), r"key 'markov_rank' must be >= 0"),
        ({}, ("markov_head_type",), r"key 'markov_head_type' is missing"),
        ({}, ("enable_confidence_head",), r"key 'enable_confidence_head' is missing"),
        ({}, ("confidence_head_with_markov",), r"key 'confidence_head_with_markov' is missing"),
        ({"mask_token_id": 320}, (), r"key 'mask_token_id' = 320 is outside the vocabulary"),
    ],
)
def test_bad_dspark_keys_are_named(changes, drop, message):
    with pytest.raises(ConfigError, match=message):
        dspark_config("vanilla", drop=drop, **changes)


def test_markov_confidence_without_markov_head_is_an_error():
    with pytest.raises(ConfigError, match="'confidence_head_with_markov' is true but markov_rank is 0"):
        dspark_config("deepspec_dflash", enable_confidence_head=True, confidence_head_with_markov=True)

"""DFlash v2 config: the published key layout, its validation rules, the tensor table (codebooks without .weight)."""

from __future__ import annotations

import copy
import math

import pytest

from ovbuild.errors import ConfigError
from ovbuild.families import detect_layout, load_draft
from ovbuild.testing import TINY_DFLASH2, write_tiny_dflash2
from ovbuild.weights.checkpoint import Checkpoint
from ovbuild.weights.config_reader import ConfigReader
from ovbuild.weights.families.dflash2 import DFlash2Config

WHERE = "draft/config.json"


def parse(nested: dict | None = None, **flat) -> DFlash2Config:
    cfg = copy.deepcopy(TINY_DFLASH2)
    cfg["dflash_config"].update(nested or {})
    cfg["dflash_config"] = {k: v for k, v in cfg["dflash_config"].items() if v is not None}
    cfg.update(flat)
    return detect_layout(cfg, WHERE).parse(ConfigReader(cfg, WHERE))


def test_tiny_v2_draft_normalizes_like_a_published_checkpoint():
    cfg = parse()
    assert isinstance(cfg, DFlash2Config) and cfg.family == "dflash2"
    assert (cfg.block_size, cfg.mask_token_id, cfg.target_layer_ids, cfg.candidate_offset) == (8, 257, (1, 3, 5), 1)
    assert (cfg.conv_kernel_size, cfg.conv_group_size, cfg.conv_groups) == (3, 16, 4)
    assert (cfg.selector_rank, cfg.selector_top_k) == (16, 6)
    assert (cfg.output_multiplier, cfg.final_logit_softcapping, cfg.input_embedding_scale) == (1.7, 2.5, 0.6)
    assert cfg.num_kv_heads == 1 and cfg.num_heads == 4
    # is_causal false: both layers bidirectional; the window only on the sliding layer
    assert cfg.sliding_windows == (10, 0) and cfg.layer_causal == (False, False)


def test_window_needs_use_sliding_window():
    assert parse(use_sliding_window=False).sliding_windows == (0, 0)


def test_v2_keys_may_sit_flat_but_must_not_contradict_the_nested_ones():
    assert parse({"selector_rank": None}, selector_rank=8).selector_rank == 8
    assert parse(selector_top_k=6).selector_top_k == 6
    with pytest.raises(
        ConfigError, match=rf"{WHERE}: key 'selector_top_k' = 4 conflicts with 'dflash_config.selector_top_k' = 6"
    ):
        parse(selector_top_k=4)


def test_transforms_default_to_neutral():
    cfg = parse({"output_multiplier": None, "final_logit_softcapping": None, "input_embedding_scale": None})
    assert (cfg.output_multiplier, cfg.final_logit_softcapping, cfg.input_embedding_scale) == (1.0, 0.0, 1.0)


@pytest.mark.parametrize(
    "nested, message",
    [
        ({"conv_group_size": 24}, "key 'dflash_config.conv_group_size' = 24 does not divide hidden_size = 64"),
        ({"conv_group_size": 0}, r"key 'dflash_config.conv_group_size' must be >= 1, got 0"),
        ({"conv_kernel_size": 0}, r"key 'dflash_config.conv_kernel_size' must be >= 1, got 0"),
        ({"conv_kernel_size": None}, "key 'dflash_config.conv_kernel_size' is missing"),
        ({"selector_rank": 0}, r"key 'dflash_config.selector_rank' must be >= 1, got 0"),
        ({"selector_top_k": 0}, r"key 'dflash_config.selector_top_k' must be >= 1, got 0"),
        ({"selector_top_k": 321}, "key 'dflash_config.selector_top_k' = 321 exceeds vocab_size = 320"),
        ({"output_multiplier": 0.0}, r"key 'dflash_config.output_multiplier' must be > 0, got 0.0"),
        ({"output_multiplier": -1.5}, r"key 'dflash_config.output_multiplier' must be > 0"),
        ({"output_multiplier": math.inf}, "key 'dflash_config.output_multiplier' must be a finite number"),
        ({"input_embedding_scale": 0}, r"key 'dflash_config.input_embedding_scale' must be > 0"),
        ({"input_embedding_scale": math.nan}, "key 'dflash_config.input_embedding_scale' must be a finite number"),
        ({"final_logit_softcapping": -1.0}, r"key 'dflash_config.final_logit_softcapping' must be >= 0"),
        ({"final_logit_softcapping": math.inf}, "key 'dflash_config.final_logit_softcapping' must be a finite number"),
        ({"selector_top_k": "16"}, "key 'dflash_config.selector_top_k' must be an integer"),
    ],
)
def test_bad_v2_values_name_file_and_key(nested, message):
    with pytest.raises(ConfigError, match=f"{WHERE}: {message}"):
        parse(nested)


def test_softcap_zero_is_off_and_accepted():
    assert parse({"final_logit_softcapping": 0}).final_logit_softcapping == 0.0


def test_tensor_table_reads_codebooks_without_weight_suffix(tmp_path):
    cfg, weights = load_draft(Checkpoint.open(write_tiny_dflash2(tmp_path / "d")))
    assert weights.checkpoint_name("candidate_selector.successor_codebook") == "candidate_selector.successor_codebook"
    assert weights.checkpoint_name("layers.1.mlp_conv.base_kernel") == "layers.1.mlp_conv.base_kernel"
    assert (
        weights.checkpoint_name("layers.1.mlp_conv.kernel_projection") == "layers.1.mlp_conv.kernel_projection.weight"
    )
    k, groups, r = cfg.conv_kernel_size, cfg.conv_groups, cfg.selector_rank
    assert weights.get("candidate_selector.predecessor_codebook", (cfg.vocab_size, r)).dtype == "f32"
    assert weights.get("layers.0.attention_conv.kernel_projection", (2 * k * groups, cfg.hidden_size)).shape
    assert weights.get("layers.0.attention_conv.base_kernel", (2, k, cfg.hidden_size)).shape == (2, k, 64)

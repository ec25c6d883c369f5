"""Hybrid Qwen3.5-family configs and tensor names, as the published checkpoints write them."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from ovbuild.errors import ConfigError, TensorError, UnsupportedError
from ovbuild.targets import load_target, parse_target_config
from ovbuild.testing.tiny_hybrid import TINY_HYBRID, TINY_HYBRID_TEXT, write_tiny_hybrid_target
from ovbuild.weights.checkpoint import Checkpoint
from ovbuild.weights.hybrid import HybridTargetConfig, parse_hybrid_config


def test_multimodal_and_text_only_layouts_read_the_same_model(tmp_path):
    nested = load_target(Checkpoint.open(write_tiny_hybrid_target(tmp_path / "mm")))
    flat = load_target(Checkpoint.open(write_tiny_hybrid_target(tmp_path / "text", text_only=True)))
    assert nested[0] == replace(flat[0], architecture="Qwen3_5ForConditionalGeneration")
    cfg = nested[0]
    assert isinstance(cfg, HybridTargetConfig) and cfg.family == "qwen3_5"
    assert cfg.layer_pattern == "LLLF" and cfg.full_layers == (3,) and cfg.linear_layers == (0, 1, 2)
    assert (cfg.rotary_dim, cfg.conv_dim, cfg.key_dim, cfg.value_dim) == (8, 2 * 32 + 96, 32, 96)
    assert nested[1].checkpoint_name("layers.2.linear_attn.A_log") == "model.language_model.layers.2.linear_attn.A_log"
    assert flat[1].checkpoint_name("layers.3.self_attn.q_proj") == "model.layers.3.self_attn.q_proj.weight"
    # the same seed draws the same tensors whatever the layout
    assert (
        nested[1].get("layers.0.linear_attn.conv1d").array == flat[1].get("layers.0.linear_attn.conv1d").array
    ).all()


def test_full_attention_interval_when_layer_types_is_absent():
    text = {k: v for k, v in TINY_HYBRID_TEXT.items() if k != "layer_types"}
    cfg = parse_hybrid_config({**TINY_HYBRID, "text_config": {**text, "num_hidden_layers": 8}}, "c.json")
    assert cfg.layer_pattern == "LLLFLLLF"
    cfg = parse_hybrid_config(
        {**TINY_HYBRID, "text_config": {**text, "num_hidden_layers": 4, "full_attention_interval": 2}}, "c.json"
    )
    assert cfg.layer_pattern == "LFLF"


def test_partial_rotary_factor_at_the_top_level_and_default():
    """Older configs put partial_rotary_factor beside rope_theta; absent, transformers uses 0.25."""
    text = {k: v for k, v in TINY_HYBRID_TEXT.items() if k != "rope_parameters"}
    cfg = parse_hybrid_config({**TINY_HYBRID, "text_config": {**text, "partial_rotary_factor": 0.5}}, "c.json")
    assert cfg.rotary_dim == 16 and cfg.rope.theta == 10000.0
    assert parse_hybrid_config({**TINY_HYBRID, "text_config": text}, "c.json").rotary_dim == 8


@pytest.mark.parametrize(
    ("config", "error", "match"),
    [
        (
            {**TINY_HYBRID, "architectures": ["Qwen3_5MoeForConditionalGeneration"]},
            ConfigError,
            "text_config.model_type' = 'qwen3_5_text' does not fit Qwen3_5MoeForConditionalGeneration",
        ),
        ({**TINY_HYBRID, "architectures": ["Qwen3NextForCausalLM"]}, UnsupportedError, "in_proj_qkvz"),
        (
            {**TINY_HYBRID, "text_config": {**TINY_HYBRID_TEXT, "model_type": "qwen3_5_moe_text"}},
            ConfigError,
            "text_config.model_type",
        ),
        (
            {**TINY_HYBRID, "text_config": {**TINY_HYBRID_TEXT, "model_type": "llama"}},
            UnsupportedError,
            "text_config.model_type' = 'llama' is not a Qwen3.5-family language model",
        ),
        (
            {**TINY_HYBRID, "text_config": {**TINY_HYBRID_TEXT, "linear_num_value_heads": 3}},
            ConfigError,
            "text_config.linear_num_value_heads",
        ),
        (
            {**TINY_HYBRID, "text_config": {**TINY_HYBRID_TEXT, "layer_types": ["linear_attention"] * 3 + ["mamba"]}},
            ConfigError,
            "text_config.layer_types",
        ),
    ],
)
def test_bad_or_unsupported_configs_name_the_key(config, error, match):
    with pytest.raises(error, match=match):
        parse_target_config(config, "c.json")


def test_missing_language_model_weights_name_both_prefixes(tmp_path):
    ckpt = Checkpoint.open(write_tiny_hybrid_target(tmp_path / "t"))
    ckpt._where = {k: v for k, v in ckpt._where.items() if "embed_tokens" not in k}
    with pytest.raises(TensorError, match=re.escape("'model.language_model.embed_tokens.weight', 'model.")):
        load_target(ckpt)

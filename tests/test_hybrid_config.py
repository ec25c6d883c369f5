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
from ovbuild.weights.mrope import MropeSpec


def test_multimodal_and_text_only_layouts_read_the_same_model(tmp_path):
    nested = load_target(Checkpoint.open(write_tiny_hybrid_target(tmp_path / "mm")))
    flat = load_target(Checkpoint.open(write_tiny_hybrid_target(tmp_path / "text", text_only=True)))
    # the same language model; the multimodal layout's can also take images
    assert nested[0].text_only() == replace(flat[0], architecture="Qwen3_5ForConditionalGeneration")
    assert nested[0].mrope == MropeSpec((1, 1, 2), True, 4) and flat[0].mrope is None
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


def test_multi_axis_rope_of_a_vision_language_checkpoint():
    rope = dict(TINY_HYBRID_TEXT["rope_parameters"], mrope_section=[2, 1, 1], mrope_interleaved=False)
    cfg = parse_hybrid_config({**TINY_HYBRID, "text_config": {**TINY_HYBRID_TEXT, "rope_parameters": rope}}, "c.json")
    assert cfg.mrope == MropeSpec((2, 1, 1), False, 4)
    assert cfg.mrope.axes().tolist() == [0, 0, 1, 2]
    assert MropeSpec((1, 1, 2), True, 4).axes().tolist() == [0, 1, 2, 0]
    # transformers' default section (Qwen3.5's published [11, 11, 10]) over 64 rotary dims
    text = dict(TINY_HYBRID_TEXT, head_dim=256, rope_parameters={"rope_theta": 1e7, "partial_rotary_factor": 0.25})
    mrope = parse_hybrid_config({**TINY_HYBRID, "text_config": text}, "c.json").mrope
    assert mrope == MropeSpec((11, 11, 10), True, 32)
    assert mrope.axes().tolist() == [0, 1, 2] * 10 + [0, 1]
    rope = dict(TINY_HYBRID_TEXT["rope_parameters"], mrope_section=[1, 1, 1], mrope_interleaved=False)
    with pytest.raises(ConfigError, match=r"c\.json: key 'text_config\.rope_parameters\.mrope_section.*summing to 4"):
        parse_hybrid_config({**TINY_HYBRID, "text_config": {**TINY_HYBRID_TEXT, "rope_parameters": rope}}, "c.json")

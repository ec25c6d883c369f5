"""Tiny hybrid Qwen3.5-family checkpoints laid out like the published ones, and DFlash v1 and v2 drafts that fit them.

The multimodal layout (Qwen3_5ForConditionalGeneration): the language model's keys nested under `text_config`, its
tensors under `model.language_model.`, the vision tower under `vision_config` and `model.visual.*`
(`tiny_vision.py`), and an `mtp.*` tensor that a build must ignore.
The text-only layout (Qwen3_5ForCausalLM, `qwen3_5_text`): flat keys, tensors under `model.`. Geometry: 4 layers
linear, linear, linear, full; grouped value heads (4 value heads over 2 key heads) with key and value head widths
that differ, partial RoPE (a quarter of head_dim), GQA in the full layer.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ovbuild.testing.tiny import random_tensor, write_checkpoint, write_tiny_dflash
from ovbuild.testing.tiny_dflash2 import TINY_DFLASH2, write_tiny_dflash2
from ovbuild.testing.tiny_vision import TINY_QWEN_VISION, qwen_vision_tensors
from ovbuild.testing.tokenizer import EOS_ID, MASK_ID, QWEN_VISION_TOKENS, write_tokenizer

TINY_HYBRID_TEXT = dict(
    model_type="qwen3_5_text",
    vocab_size=320,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=4,
    layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
    full_attention_interval=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=16,
    linear_value_head_dim=24,
    linear_conv_kernel_dim=4,
    hidden_act="silu",
    attn_output_gate=True,
    max_position_embeddings=4096,
    rms_norm_eps=1e-6,
    rope_parameters={
        "rope_type": "default",
        "rope_theta": 10000000.0,
        "partial_rotary_factor": 0.25,
        "mrope_section": [1, 1, 2],
        "mrope_interleaved": True,
    },
    tie_word_embeddings=False,
    attention_bias=False,
    bos_token_id=EOS_ID,
    eos_token_id=EOS_ID,
)
TINY_HYBRID = dict(
    architectures=["Qwen3_5ForConditionalGeneration"],
    model_type="qwen3_5",
    text_config=TINY_HYBRID_TEXT,
    vision_config=TINY_QWEN_VISION,
    image_token_id=258,
    video_token_id=259,
    vision_start_token_id=260,
    vision_end_token_id=261,
    tie_word_embeddings=False,
)
TINY_PREPROCESSOR = dict(
    image_processor_type="Qwen2VLImageProcessor",
    patch_size=2,
    temporal_patch_size=2,
    merge_size=2,
    size={"shortest_edge": 64, "longest_edge": 1024},  # pixels: 8 x 8 up to 32 x 32, so 4 to 64 image tokens
    image_mean=[0.5, 0.5, 0.5],
    image_std=[0.5, 0.5, 0.5],
)
TINY_HYBRID_TEXT_ONLY = dict(TINY_HYBRID_TEXT, architectures=["Qwen3_5ForCausalLM"])


def hybrid_layer_shapes(text: dict, layer_type: str) -> dict[str, tuple[int, ...]]:
    """Tensor shapes of one layer, keyed by the name after `layers.N.`, as transformers' Qwen3.5 modules hold them."""
    h, inter = text["hidden_size"], text["intermediate_size"]
    shapes = {
        "input_layernorm.weight": (h,),
        "post_attention_layernorm.weight": (h,),
        "mlp.gate_proj.weight": (inter, h),
        "mlp.up_proj.weight": (inter, h),
        "mlp.down_proj.weight": (h, inter),
    }
    if layer_type == "full_attention":
        d, nh, nkv = text["head_dim"], text["num_attention_heads"], text["num_key_value_heads"]
        shapes |= {
            "self_attn.q_proj.weight": (2 * nh * d, h),  # queries and their output gate, head by head
            "self_attn.k_proj.weight": (nkv * d, h),
            "self_attn.v_proj.weight": (nkv * d, h),
            "self_attn.o_proj.weight": (h, nh * d),
            "self_attn.q_norm.weight": (d,),
            "self_attn.k_norm.weight": (d,),
        }
        return shapes
    nk, nv = text["linear_num_key_heads"], text["linear_num_value_heads"]
    dk, dv, kernel = text["linear_key_head_dim"], text["linear_value_head_dim"], text["linear_conv_kernel_dim"]
    conv_dim = 2 * nk * dk + nv * dv
    return shapes | {
        "linear_attn.in_proj_qkv.weight": (conv_dim, h),
        "linear_attn.in_proj_z.weight": (nv * dv, h),
        "linear_attn.in_proj_b.weight": (nv, h),
        "linear_attn.in_proj_a.weight": (nv, h),
        "linear_attn.conv1d.weight": (conv_dim, 1, kernel),  # depthwise Conv1d: [channels, 1, kernel]
        "linear_attn.A_log": (nv,),
        "linear_attn.dt_bias": (nv,),
        "linear_attn.norm.weight": (dv,),
        "linear_attn.out_proj.weight": (h, nv * dv),
    }


def _layer_tensor(rng: np.random.Generator, name: str, shape: tuple[int, ...]) -> np.ndarray:
    if name.endswith("layernorm.weight") or name.endswith(("q_norm.weight", "k_norm.weight")):
        # these norms scale by (1 + weight): stored near 0, as transformers initializes them
        return (0.1 * rng.standard_normal(shape)).astype(np.float32)
    if name.endswith("A_log"):
        # decay rates exp(A_log) in [0.05, 1]: the state keeps a memory of several tokens, so a wrong state shows
        return np.log(rng.uniform(0.05, 1.0, shape)).astype(np.float32)
    if name.endswith("dt_bias"):
        return (0.5 * rng.standard_normal(shape)).astype(np.float32)
    if name.endswith("conv1d.weight"):
        return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)
    return random_tensor(rng, shape)


def write_tiny_hybrid_target(
    folder: str | Path,
    *,
    seed: int = 0,
    dtype: str = "f32",
    text_only: bool = False,
    vision: dict | None = None,
    preprocessor: dict | None = None,
    **overrides,
) -> Path:
    """A random hybrid target with a byte-level tokenizer; `overrides` replace keys of the language model's config
    (`text_config`, or the flat config when `text_only`); `vision` and `preprocessor` replace keys of the tower's
    `vision_config` and of preprocessor_config.json (a wider tower, published patch sizes: the benchmarks')."""
    text = {**TINY_HYBRID_TEXT, **overrides}
    if text_only:
        config, prefix = {**TINY_HYBRID_TEXT_ONLY, **overrides}, "model."
    else:
        tower = {**TINY_QWEN_VISION, **(vision or {})}
        config, prefix = {**TINY_HYBRID, "text_config": text, "vision_config": tower}, "model.language_model."
    rng = np.random.default_rng(seed)
    h, v = text["hidden_size"], text["vocab_size"]
    tensors = {f"{prefix}embed_tokens.weight": rng.standard_normal((v, h)).astype(np.float32)}
    for i, layer_type in enumerate(text["layer_types"]):
        for name, shape in hybrid_layer_shapes(text, layer_type).items():
            tensors[f"{prefix}layers.{i}.{name}"] = _layer_tensor(rng, name, shape)
    tensors[f"{prefix}norm.weight"] = (0.1 * rng.standard_normal(h)).astype(np.float32)
    if not text["tie_word_embeddings"]:
        tensors["lm_head.weight"] = random_tensor(rng, (v, h))
    if not text_only:
        # the vision tower (its own IR) and the MTP head, which a text build ignores
        tensors |= qwen_vision_tensors(config["vision_config"], config["architectures"][0], seed)
        tensors["mtp.fc.weight"] = random_tensor(rng, (h, 2 * h))
    folder = write_checkpoint(folder, config, tensors, dtype)
    write_tokenizer(folder, () if text_only else QWEN_VISION_TOKENS)
    if not text_only:  # the image processor's settings, sized to the tiny tower (2 x 2 patches, 2 x 2 merge windows)
        (folder / "preprocessor_config.json").write_text(
            json.dumps({**TINY_PREPROCESSOR, **(preprocessor or {})}) + "\n"
        )
    (folder / "generation_config.json").write_text(
        json.dumps({"eos_token_id": text["eos_token_id"], "do_sample": False}) + "\n"
    )
    return folder


def write_tiny_hybrid_dflash(folder: str | Path, *, seed: int = 1, dtype: str = "f32", **overrides) -> Path:
    """A z-lab-layout DFlash v1 draft for the tiny hybrid target: taps of a linear layer, of the full layer and of
    the last layer (post-norm), target hidden size 64, the target's embedding and lm_head."""
    dflash = {"mask_token_id": MASK_ID, "target_layer_ids": [0, 2, 3], "block_size": 8}
    keys = dict(num_target_layers=4, dflash_config=dflash, **overrides)
    return write_tiny_dflash(folder, seed=seed, dtype=dtype, target_hidden_size=64, **keys)


def write_tiny_hybrid_dflash2(folder: str | Path, *, seed: int = 2, dtype: str = "f32", **overrides) -> Path:
    """A DFlash v2 draft for the tiny hybrid target: the taps of `write_tiny_hybrid_dflash` (a linear layer, the full
    layer, the last layer), target hidden size 64, the target's embedding and lm_head."""
    nested = {**TINY_DFLASH2["dflash_config"], "target_layer_ids": [0, 2, 3]}
    keys = dict(num_target_layers=4, dflash_config=nested, **overrides)
    return write_tiny_dflash2(folder, seed=seed, dtype=dtype, target_hidden_size=64, **keys)

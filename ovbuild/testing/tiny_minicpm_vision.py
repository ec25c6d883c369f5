"""Tiny MiniCPM-V 4.7 checkpoints with a complete vision side, laid out as the published ones: the language model of
`write_tiny_minicpmv` (1B-like or A3B-like, its shard untouched) plus every `model.vision_tower.*` and
`model.merger.*` tensor transformers' MiniCPMV4_7Model holds, in a shard of their own, deterministic by seed.

Geometry: hidden 32, 3 layers of 4 heads, patch 2, a 16 x 16 position table (image_size 32), the window merger after
layer 1 (`insert_layer_id` at the top level, as published), one 2x2 merger round to the language model's 64.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ovbuild.testing.tiny import random_tensor
from ovbuild.testing.tiny_moe import MINICPMV_TEXT, MINICPMV_TOP, write_tiny_minicpmv
from ovbuild.testing.tokenizer import write_tokenizer
from ovbuild.weights.safetensors_file import write_safetensors
from ovbuild.weights.tensor import WeightTensor
from ovbuild.weights.vision_minicpm import (
    canonical_names,
    parse_minicpm_vision,
    tensor_name,
    tensor_params,
    tensor_shape,
)

TINY_MINICPM_VISION = dict(
    model_type="minicpmv4_7_vision",
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_channels=3,
    image_size=32,
    patch_size=2,
    hidden_act="gelu_pytorch_tanh",
    layer_norm_eps=1e-6,
    insert_layer_id=1,
    window_kernel_size=[2, 2],
)
TINY_MINICPM_TOP = dict(
    MINICPMV_TOP,
    vision_config=TINY_MINICPM_VISION,
    insert_layer_id=1,
    downsample_mode="16x",
    merge_kernel_size=[2, 2],
    merger_times=1,
)
VISION_SHARD = "model-00002-of-00002.safetensors"
INDEX = "model.safetensors.index.json"


def tiny_minicpm_config(kind: str = "1b", top: dict | None = None, vision: dict | None = None) -> dict:
    """The tiny config.json; `top` replaces top-level keys, `vision` keys of vision_config."""
    config = {**TINY_MINICPM_TOP, **(top or {}), "text_config": MINICPMV_TEXT[kind]}
    config["vision_config"] = {**TINY_MINICPM_VISION, **(vision or {})}
    return config


def vision_tensors(config: dict, seed: int) -> dict[str, np.ndarray]:
    """Random values for every vision tensor `config` asks for, named and shaped as published."""
    cfg = parse_minicpm_vision(config, "config.json")
    rng = np.random.default_rng(seed)
    tensors = {}
    for name in canonical_names(cfg.with_mode("16x")):  # the window merger's tensors are there in either mode
        for param in tensor_params(name):
            shape = tensor_shape(cfg, name, param)
            if param == "bias":
                value = 0.1 * rng.standard_normal(shape)
            elif name == "patch_embedding":  # fan-in is C*p*p, not the last axis
                value = rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))
            elif name == "position_embedding":
                value = 0.5 * rng.standard_normal(shape)
            else:
                value = random_tensor(rng, shape)
            tensors[tensor_name(name, param)] = np.asarray(value, np.float32)
    return tensors


def write_tiny_minicpm_vision(
    folder: str | Path,
    kind: str = "1b",
    *,
    seed: int = 0,
    top: dict | None = None,
    vision: dict | None = None,
    drop: tuple[str, ...] = (),
) -> Path:
    """A random MiniCPM-V 4.7 target (`kind` 1b or a3b) with its whole vision side; `top` / `vision` replace config
    keys, `drop` leaves tensors out (for the error tests)."""
    folder = Path(folder)
    write_tiny_minicpmv(folder, kind, seed=seed)
    config = tiny_minicpm_config(kind, top, vision)
    tensors = {n: a for n, a in vision_tensors(config, seed + 3000).items() if n not in drop}
    write_safetensors(folder / VISION_SHARD, {n: WeightTensor(n, "f32", a) for n, a in tensors.items()})
    index = json.loads((folder / INDEX).read_text())
    text = {n: f for n, f in index["weight_map"].items() if f != VISION_SHARD}
    index["weight_map"] = text | {n: VISION_SHARD for n in tensors}
    (folder / INDEX).write_text(json.dumps(index, indent=2) + "\n")
    written = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "torch_dtype": written["torch_dtype"]}, indent=2) + "\n")
    return folder


# The markers MiniCPM-V's prompts write around each crop, special tokens of the tiny tokenizer.
MINICPM_IMAGE_TOKENS = ("<|image_pad|>", "<image>", "</image>", "<slice>", "</slice>", "<image_id>", "</image_id>")
# MiniCPM-V's processor sized to the tiny tower: 2-pixel patches, crops of about 16 x 16 pixels (4 tokens each)
TINY_MINICPM_PROCESSOR = dict(
    image_processor_type="MiniCPMV4_6ImageProcessor",
    patch_size=2,
    scale_resolution=16,
    max_slice_nums=4,
    slice_mode=True,
    downsample_mode="16x",
    use_image_id=True,
    image_mean=[0.5] * 3,
    image_std=[0.5] * 3,
)


def write_tiny_minicpm_vision_for_images(path: Path) -> Path:
    """The 1B-like checkpoint with what image files need beside it: a tokenizer with the crop markers and a
    preprocessor_config.json sized to the tiny tower."""
    ckpt = write_tiny_minicpm_vision(path)
    write_tokenizer(ckpt, MINICPM_IMAGE_TOKENS)
    (ckpt / "preprocessor_config.json").write_text(json.dumps(TINY_MINICPM_PROCESSOR))
    return ckpt

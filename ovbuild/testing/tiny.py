"""Tiny random checkpoints laid out like the published ones (Qwen3 target, z-lab DFlash draft), deterministic by seed.

Small enough for fast tests but not degenerate: grouped-query attention, head_dim != hidden / heads, several layers,
three target taps (the last target layer among them, to exercise its post-norm tap).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ovbuild.testing.tokenizer import EOS_ID, MASK_ID, write_tokenizer
from ovbuild.weights.draft_config import default_target_layer_ids
from ovbuild.weights.dtypes import f32_to_bf16
from ovbuild.weights.safetensors_file import write_safetensors
from ovbuild.weights.tensor import WeightTensor
from ovbuild.weights.tensor_names import QWEN3_LAYER

# What a Qwen3-style config.json of the tiny family says about geometry: GQA (2 KV heads for 4 query heads) and
# head_dim 32, so heads * head_dim (128) != hidden_size (64), as in the published Qwen3 drafts.
_TINY_GEOMETRY = dict(
    model_type="qwen3",
    vocab_size=320,
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    hidden_act="silu",
    max_position_embeddings=4096,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    rope_scaling=None,
    tie_word_embeddings=False,
    attention_bias=False,
    use_sliding_window=False,
    sliding_window=None,
)
TINY_TARGET = dict(
    _TINY_GEOMETRY,
    architectures=["Qwen3ForCausalLM"],
    num_hidden_layers=6,
    attention_dropout=0.0,
    layer_types=["full_attention"] * 6,
    bos_token_id=EOS_ID,
    eos_token_id=EOS_ID,
)
TINY_DRAFT = dict(
    _TINY_GEOMETRY,
    architectures=["DFlashDraftModel"],
    auto_map={"AutoModel": "dflash.DFlashDraftModel"},
    num_hidden_layers=2,
    layer_types=["full_attention"] * 2,
    num_target_layers=6,
    dflash_config={"mask_token_id": MASK_ID, "target_layer_ids": [1, 3, 5], "block_size": 8},
)


def layer_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    """Per-layer tensor shapes of a Qwen3-style layer, keyed like QWEN3_LAYER."""
    h, inter = cfg["hidden_size"], cfg["intermediate_size"]
    d = cfg.get("head_dim") or h // cfg["num_attention_heads"]  # a config without head_dim derives it
    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    shapes = dict(
        zip(
            QWEN3_LAYER,
            [(h,), (q, h), (kv, h), (kv, h), (h, q), (d,), (d,), (h,), (inter, h), (inter, h), (h, inter)],
            strict=True,
        )
    )
    return shapes


def random_tensor(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Norm weights near 1, matrices scaled by 1/sqrt(fan_in) so activations stay O(1) through every layer."""
    if len(shape) == 1:
        return (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
    return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)


def write_checkpoint(
    folder: str | Path, config: dict, tensors: dict[str, np.ndarray], dtype: str = "f32", shards: int = 1
) -> Path:
    """Write config.json and the weights (f32 or bf16), as one file or `shards` files plus an index."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = {**config, "torch_dtype": {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}[dtype]}
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    stored = {n: WeightTensor(n, dtype, _cast(a, dtype)) for n, a in tensors.items()}
    if shards == 1:
        write_safetensors(folder / "model.safetensors", stored)
        return folder
    names = list(stored)
    weight_map = {}
    for s, part in enumerate(np.array_split(np.arange(len(names)), shards)):
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        write_safetensors(folder / file, {names[i]: stored[names[i]] for i in part})
        weight_map.update({names[i]: file for i in part})
    index = {"metadata": {"total_size": sum(t.array.nbytes for t in stored.values())}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return folder


def write_tiny_target(folder: str | Path, *, seed: int = 0, dtype: str = "f32", shards: int = 1, **overrides) -> Path:
    """A random Qwen3 target with a byte-level tokenizer; `overrides` replace config.json keys."""
    cfg = {**TINY_TARGET, **overrides}
    rng = np.random.default_rng(seed)
    h, v = cfg["hidden_size"], cfg["vocab_size"]
    tensors = {"model.embed_tokens.weight": rng.standard_normal((v, h)).astype(np.float32)}
    for i in range(cfg["num_hidden_layers"]):
        for name, shape in layer_shapes(cfg).items():
            tensors[f"model.layers.{i}.{name}.weight"] = random_tensor(rng, shape)
    tensors["model.norm.weight"] = random_tensor(rng, (h,))
    if not cfg["tie_word_embeddings"]:
        tensors["lm_head.weight"] = random_tensor(rng, (v, h))
    folder = write_checkpoint(folder, cfg, tensors, dtype, shards)
    write_tokenizer(folder)
    (folder / "generation_config.json").write_text(
        json.dumps({"eos_token_id": cfg["eos_token_id"], "do_sample": False}) + "\n"
    )
    return folder


def write_tiny_dflash(
    folder: str | Path, *, seed: int = 1, dtype: str = "f32", target_hidden_size: int = 64, **overrides
) -> Path:
    """A random z-lab-layout DFlash v1 draft (no embed_tokens, no lm_head) for the tiny target."""
    cfg = {**TINY_DRAFT, **overrides}
    rng = np.random.default_rng(seed)
    keys = {**cfg, **(cfg.get("dflash_config") or {})}  # DFlash keys sit flat or nested
    ids = keys.get("target_layer_ids") or default_target_layer_ids(keys["num_target_layers"], cfg["num_hidden_layers"])
    taps = len(ids)
    return write_checkpoint(folder, cfg, draft_backbone_tensors(rng, cfg, taps * target_hidden_size), dtype)


def draft_backbone_tensors(
    rng: np.random.Generator,
    cfg: dict,
    fc_inputs: int,
    layer_extras: Callable[[int], dict[str, np.ndarray]] | None = None,
) -> dict[str, np.ndarray]:
    """The tensors every DFlash-family draft has (fc, hidden_norm, decoder layers, norm), drawn in file order;
    `layer_extras(i)` adds a family's own tensors of layer i right after its standard ones."""
    h = cfg["hidden_size"]
    tensors = {"fc.weight": random_tensor(rng, (h, fc_inputs)), "hidden_norm.weight": random_tensor(rng, (h,))}
    for i in range(cfg["num_hidden_layers"]):
        for name, shape in layer_shapes(cfg).items():
            tensors[f"layers.{i}.{name}.weight"] = random_tensor(rng, shape)
        if layer_extras is not None:
            tensors.update(layer_extras(i))
    tensors["norm.weight"] = random_tensor(rng, (h,))
    return tensors


def _cast(a: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bf16":
        return f32_to_bf16(a)
    return a.astype({"f32": np.float32, "f16": np.float16}[dtype])

"""Real-scale shapes for benchmarks, and random bf16 checkpoints of them written a tensor at a time.

QWEN3_4B is shaped like Qwen/Qwen3-4B (36 layers, hidden 2560, tied embedding), QWEN3_4B_DFLASH_B16 like
z-lab/Qwen3-4B-DFlash-b16 (5 layers, block 16, taps [1, 9, 17, 25, 33]). QWEN36_SCALED is Qwen/Qwen3.6-27B's
hybrid geometry scaled to fit a small machine (below), QWEN36_SCALED_DFLASH a DFlash v1 draft for it. Values are
random: timing and memory do not depend on them.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ovbuild.testing import TINY_DRAFT, TINY_TARGET
from ovbuild.testing.tiny import layer_shapes
from ovbuild.testing.tiny_hybrid import TINY_HYBRID_TEXT_ONLY, hybrid_layer_shapes
from ovbuild.weights.dtypes import f32_to_bf16
from ovbuild.weights.safetensors_file import write_safetensors
from ovbuild.weights.tensor import WeightTensor

_QWEN3_4B_GEOMETRY = {
    "vocab_size": 151936,
    "hidden_size": 2560,
    "intermediate_size": 9728,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "rope_theta": 1000000.0,
    "max_position_embeddings": 40960,
    "torch_dtype": "bfloat16",
}
QWEN3_4B = {
    **TINY_TARGET,
    **_QWEN3_4B_GEOMETRY,
    "num_hidden_layers": 36,
    "layer_types": ["full_attention"] * 36,
    "tie_word_embeddings": True,  # as Qwen3-4B: the embedding table is also the lm_head
    "eos_token_id": 151645,
    "bos_token_id": 151643,
}
QWEN3_4B_DFLASH_B16 = {
    **TINY_DRAFT,
    **_QWEN3_4B_GEOMETRY,
    "num_hidden_layers": 5,
    "layer_types": ["full_attention"] * 5,
    "num_target_layers": 36,
    "dflash_config": {"mask_token_id": 151669, "target_layer_ids": [1, 9, 17, 25, 33], "block_size": 16},
}


# Qwen/Qwen3.6-27B (text): 64 layers, 3 linear-attention (Gated DeltaNet) : 1 full attention, hidden 5120, linear
# attention 16 key heads / 48 value heads of 128, conv kernel 4, full attention 24 query / 4 KV heads of 256 (output
# gate, partial RoPE), MLP 17408, vocabulary 248320. Scaled: 16 layers in the same 3:1 pattern, hidden 2048, heads
# per layer cut by 2-3x at the same head widths (so each head's state and attention work is Qwen3.6's), MLP 6912;
# the vocabulary is kept (the lm_head is then a larger share of a decode than at 27B).
QWEN36_SCALED = {
    **TINY_HYBRID_TEXT_ONLY,
    "vocab_size": 248320,
    "hidden_size": 2048,
    "intermediate_size": 6912,
    "num_hidden_layers": 16,
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"] * 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 256,
    "linear_num_key_heads": 8,
    "linear_num_value_heads": 24,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 10000000.0,
        "partial_rotary_factor": 0.25,
        "mrope_section": [11, 11, 10],
        "mrope_interleaved": True,
    },
    "max_position_embeddings": 262144,
    "torch_dtype": "bfloat16",
    "eos_token_id": 248044,
    "bos_token_id": 248044,
}
QWEN36_SCALED_DFLASH = {
    **TINY_DRAFT,
    "vocab_size": 248320,
    "hidden_size": 2048,
    "intermediate_size": 6912,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "rope_theta": 10000000.0,
    "max_position_embeddings": 262144,
    "torch_dtype": "bfloat16",
    "num_hidden_layers": 5,
    "layer_types": ["full_attention"] * 5,
    "num_target_layers": 16,
    "dflash_config": {"mask_token_id": 248070, "target_layer_ids": [1, 4, 8, 11, 14], "block_size": 16},
}


def random_bf16(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """bf16 bits of N(0, 0.02^2) weights (norm vectors near 1), generated a few rows at a time."""
    if len(shape) == 1:
        return f32_to_bf16(1.0 + 0.02 * rng.standard_normal(shape, dtype=np.float32))
    out = np.empty(shape, np.uint16)
    rows = max(1, (1 << 24) // shape[1])
    for begin in range(0, shape[0], rows):
        out[begin : begin + rows] = f32_to_bf16(0.02 * rng.standard_normal(out[begin : begin + rows].shape, np.float32))
    return out


def write_part(folder: Path, part: str, shapes: dict[str, tuple[int, ...]], rng: np.random.Generator) -> None:
    """One safetensors file of random bf16 tensors; a checkpoint is several of these (no index needed)."""
    tensors = {n: WeightTensor(n, "bf16", random_bf16(rng, s)) for n, s in shapes.items()}
    write_safetensors(folder / f"{part}.safetensors", tensors)


def write_config(folder: Path, config: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return folder


def write_target(folder: Path, config: dict = QWEN3_4B, layers: bool = True, seed: int = 0) -> Path:
    """A random Qwen3 target, one file per layer; `layers=False` writes only the tables a draft export reads."""
    rng = np.random.default_rng(seed)
    write_config(folder, config)
    table = (config["vocab_size"], config["hidden_size"])
    tables = {"model.embed_tokens.weight": table, "model.norm.weight": table[1:]}
    if not config["tie_word_embeddings"]:
        tables["lm_head.weight"] = table
    write_part(folder, "tables", tables, rng)
    for i in range(config["num_hidden_layers"] if layers else 0):
        shapes = {f"model.layers.{i}.{n}.weight": s for n, s in layer_shapes(config).items()}
        write_part(folder, f"layer-{i}", shapes, rng)
    return folder


def write_draft(folder: Path, config: dict = QWEN3_4B_DFLASH_B16, target_hidden: int = 2560, seed: int = 1) -> Path:
    """A random z-lab-layout DFlash draft, one file per layer."""
    rng = np.random.default_rng(seed)
    write_config(folder, config)
    h, taps = config["hidden_size"], len(config["dflash_config"]["target_layer_ids"])
    write_part(
        folder, "fc", {"fc.weight": (h, taps * target_hidden), "hidden_norm.weight": (h,), "norm.weight": (h,)}, rng
    )
    for i in range(config["num_hidden_layers"]):
        write_part(folder, f"layer-{i}", {f"layers.{i}.{n}.weight": s for n, s in layer_shapes(config).items()}, rng)
    return folder


def write_hybrid_target(folder: Path, config: dict = QWEN36_SCALED, seed: int = 0) -> Path:
    """A random text-only Qwen3.5-family target (flat config, tensors under `model.`), one file per layer."""
    rng = np.random.default_rng(seed)
    write_config(folder, config)
    table = (config["vocab_size"], config["hidden_size"])
    write_part(folder, "tables", {"model.embed_tokens.weight": table, "model.norm.weight": table[1:]}, rng)
    if not config["tie_word_embeddings"]:
        write_part(folder, "lm_head", {"lm_head.weight": table}, rng)
    for i, layer_type in enumerate(config["layer_types"]):
        shapes = {f"model.layers.{i}.{n}": s for n, s in hybrid_layer_shapes(config, layer_type).items()}
        write_part(folder, f"layer-{i}", shapes, rng)
    return folder

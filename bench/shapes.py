"""Real-scale shapes for benchmarks, and random bf16 checkpoints of them written a tensor at a time.

QWEN3_4B is shaped like Qwen/Qwen3-4B (36 layers, hidden 2560, tied embedding), QWEN3_4B_DFLASH_B16 like
z-lab/Qwen3-4B-DFlash-b16 (5 layers, block 16, taps [1, 9, 17, 25, 33]). QWEN36_SCALED is Qwen/Qwen3.6-27B's
hybrid geometry scaled to fit a small machine (below), QWEN36_SCALED_DFLASH a DFlash v1 draft for it.
QWEN35_MOE_SCALED is Qwen3.5-35B-A3B's mixture of experts at half its widths (MOE_SPEC, MOE_HIDDEN: also the one
layer bench_cost_model.py's `--moe-designs` times), QWEN35_MOE_SCALED_DFLASH a DFlash v1 draft for it. Values are
random: timing and memory do not depend on them.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ovbuild.testing import TINY_DRAFT, TINY_TARGET
from ovbuild.testing.tiny import layer_shapes
from ovbuild.testing.tiny_hybrid import TINY_HYBRID_TEXT_ONLY, hybrid_layer_shapes
from ovbuild.weights.checkpoint import Checkpoint
from ovbuild.weights.dtypes import f32_to_bf16
from ovbuild.weights.moe import MoeSpec, moe_tensor_table
from ovbuild.weights.safetensors_file import write_safetensors
from ovbuild.weights.tensor import WeightTensor
from ovbuild.weights.tensor_names import WeightSource

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


# Qwen3.5-35B-A3B's experts: 256, 8 per token; hidden 2048 -> 1024 and expert width 512 -> 256 so that a layer's
# experts (201 M weights) fit beside other work on a small machine; the shared expert has the expert width.
MOE_SPEC = MoeSpec(num_experts=256, top_k=8, expert_intermediate_size=256, shared_intermediate_size=256)
MOE_HIDDEN = 1024
# A whole target: Qwen3.5-35B-A3B (40 layers LLLF, hidden 2048, 16 / 2 attention heads of 256, linear attention
# 16 key / 32 value heads of 128, 256 experts of 512, 8 per token, shared expert 512, vocabulary 248320) scaled as
# MOE_SPEC: hidden 1024, experts of 256, 4 layers LLLF, heads halved at the same widths; the vocabulary kept.
QWEN35_MOE_SCALED = {
    **{k: v for k, v in QWEN36_SCALED.items() if k != "intermediate_size"},
    "architectures": ["Qwen3_5MoeForCausalLM"],
    "model_type": "qwen3_5_moe_text",
    "hidden_size": MOE_HIDDEN,
    "num_hidden_layers": 4,
    "layer_types": ["linear_attention"] * 3 + ["full_attention"],
    "num_attention_heads": 8,
    "num_key_value_heads": 1,
    "linear_num_key_heads": 8,
    "linear_num_value_heads": 16,
    "num_experts": MOE_SPEC.num_experts,
    "num_experts_per_tok": MOE_SPEC.top_k,
    "moe_intermediate_size": MOE_SPEC.expert_intermediate_size,
    "shared_expert_intermediate_size": MOE_SPEC.shared_intermediate_size,
}
QWEN35_MOE_SCALED_DFLASH = {
    **QWEN36_SCALED_DFLASH,
    "hidden_size": MOE_HIDDEN,
    "intermediate_size": 3072,
    "num_target_layers": 4,
    "dflash_config": {**QWEN36_SCALED_DFLASH["dflash_config"], "target_layer_ids": [0, 1, 2, 3]},
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


def moe_shapes(p: str, spec: MoeSpec = MOE_SPEC, hidden: int = MOE_HIDDEN) -> dict[str, tuple[int, ...]]:
    """The MoE MLP's tensor shapes under prefix `p` (`...layers.N.mlp.`), fused experts."""
    e, inter, s, h = spec.num_experts, spec.expert_intermediate_size, spec.shared_intermediate_size, hidden
    return {
        f"{p}gate.weight": (e, h),
        f"{p}shared_expert_gate.weight": (1, h),
        f"{p}shared_expert.gate_proj.weight": (s, h),
        f"{p}shared_expert.up_proj.weight": (s, h),
        f"{p}shared_expert.down_proj.weight": (h, s),
        f"{p}experts.gate_up_proj": (e, 2 * inter, h),
        f"{p}experts.down_proj": (e, h, inter),
    }


def write_moe_layer(folder: Path, spec: MoeSpec = MOE_SPEC, hidden: int = MOE_HIDDEN) -> WeightSource:
    """A random bf16 checkpoint of one MoE layer (layer 0) in the fused layout, opened as a weight source."""
    write_config(folder, {})
    write_part(
        folder, "layer-0", moe_shapes("model.language_model.layers.0.mlp.", spec, hidden), np.random.default_rng(0)
    )
    return WeightSource(Checkpoint.open(folder), moe_tensor_table("model.language_model.", spec.num_experts))


def write_moe_target(folder: Path, config: dict = QWEN35_MOE_SCALED, seed: int = 0) -> Path:
    """A random text-only Qwen3.5 MoE target (flat config, tensors under `model.`), one file per layer."""
    rng = np.random.default_rng(seed)
    write_config(folder, config)
    spec = MoeSpec(
        num_experts=config["num_experts"],
        top_k=config["num_experts_per_tok"],
        expert_intermediate_size=config["moe_intermediate_size"],
        shared_intermediate_size=config["shared_expert_intermediate_size"],
    )
    table = (config["vocab_size"], config["hidden_size"])
    write_part(folder, "tables", {"model.embed_tokens.weight": table, "model.norm.weight": table[1:]}, rng)
    write_part(folder, "lm_head", {"lm_head.weight": table}, rng)
    for i, layer_type in enumerate(config["layer_types"]):
        dense = {
            f"model.layers.{i}.{n}": s
            for n, s in hybrid_layer_shapes(config | {"intermediate_size": 1}, layer_type).items()
        }
        shapes = {n: s for n, s in dense.items() if ".mlp." not in n} | moe_shapes(
            f"model.layers.{i}.mlp.", spec, table[1]
        )
        write_part(folder, f"layer-{i}", shapes, rng)
    return folder

"""Tiny Qwen3.5-family MoE and MiniCPM-V 4.7 checkpoints laid out like the published ones, and DSpark drafts that fit
them, deterministic by seed.

- MoE hybrid target (Qwen3_5MoeForConditionalGeneration): the tiny hybrid geometry (LLLF) with every MLP a mixture
  of 8 experts, 3 per token, fused `mlp.experts.gate_up_proj` / `down_proj` (or one module per expert with
  `per_expert=True`), a shared expert and its gate. Router rows 5 and 2 are equal, so those experts always tie
  and the top-k must break the tie as torch.topk does.
- MiniCPM-V 4.7 (MiniCPMV4_7ForConditionalGeneration): a 1B-like target (`text_config.model_type` qwen3_5_text) and
  an A3B-like one (qwen3_5_moe_text), their language model under `model.language_model.`, plus a few
  `model.vision_tower.*` / `model.merger.*` tensors in a shard of their own that a text build never opens.
- DSpark drafts for them: Qwen3DSparkModel with the DSpark keys flat or nested in `dflash_config`.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ovbuild.testing.tiny import random_tensor, write_checkpoint
from ovbuild.testing.tiny_dspark import write_tiny_dspark
from ovbuild.testing.tiny_hybrid import TINY_HYBRID, TINY_HYBRID_TEXT, write_tiny_hybrid_target
from ovbuild.testing.tokenizer import MASK_ID
from ovbuild.weights.safetensors_file import write_safetensors
from ovbuild.weights.tensor import WeightTensor

TINY_MOE_TEXT = dict(
    {k: v for k, v in TINY_HYBRID_TEXT.items() if k != "intermediate_size"},
    model_type="qwen3_5_moe_text",
    num_experts=8,
    num_experts_per_tok=3,
    moe_intermediate_size=32,
    shared_expert_intermediate_size=48,
    router_aux_loss_coef=0.001,
)
TINY_MOE = dict(
    TINY_HYBRID,
    architectures=["Qwen3_5MoeForConditionalGeneration"],
    model_type="qwen3_5_moe",
    text_config=TINY_MOE_TEXT,
    vision_config=dict(TINY_HYBRID["vision_config"], model_type="qwen3_5_moe"),
)
TIED_EXPERTS = (2, 5)  # router rows equal: their scores tie in every row
MINICPMV_TOP = dict(
    architectures=["MiniCPMV4_7ForConditionalGeneration"],
    model_type="minicpmv4_7",
    vision_config={"model_type": "minicpmv4_7_vision", "hidden_size": 16, "num_hidden_layers": 1, "patch_size": 2},
    insert_layer_id=0,
    image_size=32,
    downsample_mode="16x",
    tie_word_embeddings=False,
)
# The layer the 1B-like target uses; the A3B-like one is the MoE text config.
MINICPMV_TEXT = {"1b": TINY_HYBRID_TEXT, "a3b": TINY_MOE_TEXT}
# The DSpark draft's keys that MiniCPM-V's drafts nest under dflash_config.
NESTED_DSPARK_KEYS = ("block_size", "mask_token_id", "target_layer_ids", "markov_rank", "confidence_head_with_markov")


def moe_layer_tensors(
    rng: np.random.Generator, text: dict, prefix: str, per_expert: bool = False
) -> dict[str, np.ndarray]:
    """One layer's MoE MLP tensors under `prefix` (`...layers.N.`), as transformers' Qwen3_5MoeSparseMoeBlock holds
    them; replaces the dense `mlp.*` tensors."""
    h, e = text["hidden_size"], text["num_experts"]
    inter, shared = text["moe_intermediate_size"], text["shared_expert_intermediate_size"]
    router = random_tensor(rng, (e, h)) * 4.0  # peaked scores, so routing differs from row to row
    router[TIED_EXPERTS[1]] = router[TIED_EXPERTS[0]]
    tensors = {
        f"{prefix}mlp.gate.weight": router,
        f"{prefix}mlp.shared_expert_gate.weight": random_tensor(rng, (1, h)),
        f"{prefix}mlp.shared_expert.gate_proj.weight": random_tensor(rng, (shared, h)),
        f"{prefix}mlp.shared_expert.up_proj.weight": random_tensor(rng, (shared, h)),
        f"{prefix}mlp.shared_expert.down_proj.weight": random_tensor(rng, (h, shared)),
    }
    gate_up = np.stack([random_tensor(rng, (2 * inter, h)) for _ in range(e)])  # [E, 2I, H]: gate rows, then up
    down = np.stack([random_tensor(rng, (h, inter)) for _ in range(e)])  # [E, H, I]
    if not per_expert:
        return tensors | {f"{prefix}mlp.experts.gate_up_proj": gate_up, f"{prefix}mlp.experts.down_proj": down}
    for x in range(e):
        tensors[f"{prefix}mlp.experts.{x}.gate_proj.weight"] = gate_up[x, :inter]
        tensors[f"{prefix}mlp.experts.{x}.up_proj.weight"] = gate_up[x, inter:]
        tensors[f"{prefix}mlp.experts.{x}.down_proj.weight"] = down[x]
    return tensors


def write_tiny_moe_target(
    folder: str | Path,
    *,
    seed: int = 0,
    dtype: str = "f32",
    per_expert: bool = False,
    top: dict | None = None,
    **overrides,
) -> Path:
    """A random Qwen3.5 MoE target (the tiny hybrid's attention layers, MoE MLPs); `overrides` replace keys of
    `text_config`, `top` replaces top-level keys."""
    text = {**TINY_MOE_TEXT, **overrides}
    config = {**TINY_MOE, **(top or {}), "text_config": text}
    return _rewrite_as_moe(write_tiny_hybrid_target(folder, seed=seed, dtype=dtype), config, seed, dtype, per_expert)


def _rewrite_as_moe(folder: Path, config: dict, seed: int, dtype: str, per_expert: bool) -> Path:
    """The dense tiny hybrid checkpoint in `folder` with its dense MLPs replaced by MoE MLPs, under `config`."""
    from ovbuild.weights.checkpoint import Checkpoint

    text = config["text_config"]
    dense = Checkpoint.open(folder)
    prefix = "model.language_model."
    # the language model's dense MLPs go; the vision tower's blocks keep their own `mlp.*`
    tensors = {n: dense.get(n).to_f32() for n in dense.tensor_names if not (n.startswith(prefix) and ".mlp." in n)}
    rng = np.random.default_rng(seed + 1000)
    for i in range(text["num_hidden_layers"]):
        tensors |= moe_layer_tensors(rng, text, f"{prefix}layers.{i}.", per_expert)
    del dense
    (folder / "model.safetensors").unlink()
    write_checkpoint(folder, config, tensors, dtype)
    return folder


def write_tiny_minicpmv(folder: str | Path, kind: str = "1b", *, seed: int = 0, dtype: str = "f32") -> Path:
    """A random MiniCPM-V 4.7 target, `kind` 1b (dense hybrid text stack) or a3b (MoE); the language model's tensors
    in one shard, the vision tower's and merger's in another, with an index as published checkpoints have."""
    folder = Path(folder)
    text = MINICPMV_TEXT[kind]
    config = {**MINICPMV_TOP, "text_config": text}
    write_tiny_hybrid_target(folder, seed=seed, dtype=dtype)
    if kind == "a3b":
        _rewrite_as_moe(folder, config, seed, dtype, per_expert=False)
    from ovbuild.weights.checkpoint import Checkpoint

    ckpt = Checkpoint.open(folder)
    tensors = {n: ckpt.get(n).to_f32() for n in ckpt.tensor_names if n.startswith(("model.language_model.", "lm_head"))}
    del ckpt
    (folder / "model.safetensors").unlink()
    write_checkpoint(folder, config, tensors, dtype, shards=1)
    text_file = folder / "model-00001-of-00002.safetensors"
    (folder / "model.safetensors").rename(text_file)
    rng = np.random.default_rng(seed + 2000)
    vision = {
        "model.vision_tower.embeddings.patch_embedding.weight": random_tensor(rng, (16, 3, 2, 2)),
        "model.vision_tower.encoder.layers.0.mlp.fc1.weight": random_tensor(rng, (64, 16)),
        "model.merger.mlp.0.weight": random_tensor(rng, (64, 64)),
    }
    vision_file = folder / "model-00002-of-00002.safetensors"
    write_safetensors(vision_file, {n: WeightTensor(n, "f32", a) for n, a in vision.items()})
    weight_map = {n: text_file.name for n in tensors} | {n: vision_file.name for n in vision}
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return folder


def write_tiny_hybrid_dspark(
    folder: str | Path, kind: str = "vanilla", *, nested: bool = False, seed: int = 7, **overrides
) -> Path:
    """A Qwen3DSparkModel draft of `kind` for the tiny hybrid, MoE and MiniCPM-V targets (4 layers, hidden 64):
    taps of layers 0, 1 and 2, its own embed_tokens and lm_head; `nested` moves the DSpark keys into
    `dflash_config` as MiniCPM-V's drafts write them."""
    keys = dict(num_target_layers=4, target_layer_ids=[0, 1, 2], mask_token_id=MASK_ID, block_size=6)
    folder = write_tiny_dspark(folder, kind, seed=seed, **{**keys, **overrides})
    if nested:
        path = Path(folder) / "config.json"
        config = json.loads(path.read_text())
        config["dflash_config"] = {k: config.pop(k) for k in NESTED_DSPARK_KEYS if k in config}
        path.write_text(json.dumps(config, indent=2) + "\n")
    return Path(folder)

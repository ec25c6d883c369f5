"""A tiny random DFlash v2 draft laid out like the published ones (z-lab DFlash2DraftModel), for the tiny target.

Not degenerate: one KV head under four query heads, one sliding and one full layer, three conv taps whose base
kernels are large on every tap (so a row really mixes in its predecessors), and non-default logit transforms.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ovbuild.testing.tiny import TINY_DRAFT, draft_backbone_tensors, random_tensor, write_checkpoint
from ovbuild.testing.tokenizer import MASK_ID

TINY_DFLASH2 = dict(
    {k: v for k, v in TINY_DRAFT.items() if k not in ("rope_theta", "rope_scaling")},
    architectures=["DFlash2DraftModel"],
    auto_map={"AutoModel": "dflash.DFlash2DraftModel"},
    num_key_value_heads=1,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    is_causal=False,
    use_sliding_window=True,
    sliding_window=10,  # above the block size (8), below the context lengths the tests reach
    layer_types=["sliding_attention", "full_attention"],
    num_target_layers=6,
    dflash_config={
        "block_size": 8,
        "mask_token_id": MASK_ID,
        "target_layer_ids": [1, 3, 5],
        "conv_kernel_size": 3,
        "conv_group_size": 16,
        "selector_rank": 16,
        "selector_top_k": 6,
        "output_multiplier": 1.7,
        "final_logit_softcapping": 2.5,
        "input_embedding_scale": 0.6,
    },
)


def write_tiny_dflash2(
    folder: str | Path, *, seed: int = 2, dtype: str = "f32", target_hidden_size: int = 64, **overrides
) -> Path:
    """A random DFlash v2 draft (no embed_tokens, no lm_head: the target's are used); `overrides` replace keys."""
    cfg = {**TINY_DFLASH2, **overrides}
    nested = cfg["dflash_config"]
    rng = np.random.default_rng(seed)
    h, v = cfg["hidden_size"], cfg["vocab_size"]
    k, groups, rank = nested["conv_kernel_size"], h // nested["conv_group_size"], nested["selector_rank"]
    taps = len(nested["target_layer_ids"])

    def convs(i: int) -> dict[str, np.ndarray]:
        tensors = {}
        for conv in ("attention_conv", "mlp_conv"):
            tensors[f"layers.{i}.{conv}.base_kernel"] = _base_kernel(rng, k, h)
            tensors[f"layers.{i}.{conv}.kernel_projection.weight"] = 0.5 * random_tensor(rng, (2 * k * groups, h))
        return tensors

    tensors = draft_backbone_tensors(rng, cfg, taps * target_hidden_size, convs)
    tensors["candidate_selector.hidden_projection.weight"] = random_tensor(rng, (rank, h))
    for book in ("predecessor_codebook", "successor_codebook"):
        tensors[f"candidate_selector.{book}"] = (0.5 * rng.standard_normal((v, rank))).astype(np.float32)
    return write_checkpoint(folder, cfg, tensors, dtype)


def write_tiny_dflash2_short_window(folder: str | Path, *, window: int = 4, block: int = 7, **options) -> Path:
    """The tiny v2 draft with its sliding layer's window below the block (block rows `window` or more apart do not see
    each other there); the tensors of `write_tiny_dflash2` for the same seed, only config.json differs."""
    nested = {**TINY_DFLASH2["dflash_config"], "block_size": block}
    return write_tiny_dflash2(folder, sliding_window=window, dflash_config=nested, **options)


def _base_kernel(rng: np.random.Generator, k: int, h: int) -> np.ndarray:
    """[2, k, H]: about 1 on the row itself, about +-0.5 on each earlier row, so every tap moves the output."""
    base = 0.5 * rng.standard_normal((2, k, h))
    base[:, 0] += 1.0
    return base.astype(np.float32)

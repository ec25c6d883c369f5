"""Tiny random Qwen3DSparkModel drafts laid out like DeepSpec's: DSpark (vanilla or gated Markov head, confidence
head) and DeepSpec DFlash (markov_rank 0), each with its own embed_tokens and lm_head, for the tiny target.

Not degenerate: the Markov bias changes many greedy choices, some to tokens outside the base logits' Top-K, as the
authors observe on trained drafts.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ovbuild.testing.tiny import TINY_TARGET, draft_backbone_tensors, random_tensor, write_checkpoint
from ovbuild.testing.tokenizer import MASK_ID
from ovbuild.weights.checkpoint import Checkpoint

# DeepSpec writes the draft config as a copy of the target's with the draft keys added flat.
TINY_DSPARK = dict(
    {k: v for k, v in TINY_TARGET.items() if k not in ("bos_token_id", "eos_token_id")},
    architectures=["Qwen3DSparkModel"],
    num_hidden_layers=2,
    layer_types=["full_attention"] * 2,
    num_target_layers=TINY_TARGET["num_hidden_layers"],
    block_size=7,
    mask_token_id=MASK_ID,
    target_layer_ids=[1, 3, 4],  # DeepSpec refuses to tap the target's last layer
    num_anchors=512,
    enable_confidence_head=True,
    confidence_head_with_markov=True,
    markov_rank=16,
    markov_head_type="vanilla",
)
# The published kinds: config keys each one writes (keys a kind leaves out are removed, as the authors do).
DSPARK_KINDS = {
    "vanilla": dict(markov_rank=16, markov_head_type="vanilla", enable_confidence_head=True),
    "gated": dict(markov_rank=16, markov_head_type="gated", enable_confidence_head=True),
    "deepspec_dflash": dict(markov_rank=0, enable_confidence_head=False),
}


def write_tiny_dspark(
    folder: str | Path,
    kind: str = "vanilla",
    *,
    seed: int = 3,
    dtype: str = "f32",
    tables_from: str | Path | None = None,
    **overrides,
) -> Path:
    """A random draft of `kind` (see DSPARK_KINDS); `overrides` replace config keys.

    tables_from: a target checkpoint whose embed_tokens and lm_head are copied, as DeepSpec does; by default the
    draft gets tables of its own (so a test can tell which tables a graph uses).
    """
    cfg = {**TINY_DSPARK, **DSPARK_KINDS[kind], **overrides}
    rank = cfg["markov_rank"]
    if rank == 0:
        cfg.pop("markov_head_type", None)
    if not cfg["enable_confidence_head"]:
        cfg.pop("confidence_head_with_markov", None)
    rng = np.random.default_rng(seed)
    h, v = cfg["hidden_size"], cfg["vocab_size"]
    tensors = draft_backbone_tensors(rng, cfg, len(cfg["target_layer_ids"]) * h)
    if tables_from is None:
        tensors["embed_tokens.weight"] = rng.standard_normal((v, h)).astype(np.float32)
        tensors["lm_head.weight"] = random_tensor(rng, (v, h))
    else:
        target = Checkpoint.open(tables_from)
        tensors["embed_tokens.weight"] = target.get("model.embed_tokens.weight").to_f32()
        tensors["lm_head.weight"] = target.get("lm_head.weight").to_f32()
    if rank:
        tensors.update(_markov_tensors(rng, cfg))
    if cfg["enable_confidence_head"]:
        width = h + (rank if cfg["confidence_head_with_markov"] else 0)
        tensors["confidence_head.proj.weight"] = random_tensor(rng, (1, width))
        tensors["confidence_head.proj.bias"] = (0.3 * rng.standard_normal(1)).astype(np.float32)
    return write_checkpoint(folder, cfg, tensors, dtype)


def _markov_tensors(rng: np.random.Generator, cfg: dict) -> dict[str, np.ndarray]:
    """W1 an embedding (unit entries); W2 scaled so that on the tiny target the bias changes about as many greedy
    choices as the authors report for trained drafts (vanilla ~45%, gated ~20%), some to tokens outside the top 8."""
    rank, h, v = cfg["markov_rank"], cfg["hidden_size"], cfg["vocab_size"]
    tensors = {
        "markov_head.markov_w1.weight": rng.standard_normal((v, rank)).astype(np.float32),
        "markov_head.markov_w2.weight": 0.4 * random_tensor(rng, (v, rank)),
    }
    if cfg["markov_head_type"] == "gated":
        tensors["markov_head.gate_proj.weight"] = random_tensor(rng, (rank, h + rank))
        tensors["markov_head.gate_proj.bias"] = (0.5 * rng.standard_normal(rank)).astype(np.float32)
    return tensors

"""Every branch of the config readers through a compiled graph against the reference (f32 IR and cache): each RoPE
type in both key layouts, a large eps (so where eps sits matters), tied embeddings, a derived head_dim, windows from
max_window_layers, flat DFlash keys with default taps, and DFlash v2 / DSpark drafts with scaled RoPE.

The reference computes RoPE from config.json itself and reads the weights with the `safetensors` package, so these
also check ovbuild.weights.rope and the checkpoint reader, which the graphs share with nothing else.
"""

from __future__ import annotations

import numpy as np
import pytest

from ovbuild.families import build_draft_models, load_draft
from ovbuild.graph.dflash import build_dflash_draft
from ovbuild.graph.target import build_target
from ovbuild.reference.qwen3 import Qwen3Reference
from ovbuild.runtime.model.paged_model import PagedModel
from ovbuild.targets import load_target, parse_target_config
from ovbuild.testing import (
    F32_NMSE,
    TINY_TARGET,
    write_tiny_dflash,
    write_tiny_dflash2,
    write_tiny_dspark,
    write_tiny_target,
)
from ovbuild.testing.references import REFERENCES as DRAFT_REFERENCES
from ovbuild.testing.tokenizer import MASK_ID
from ovbuild.weights.checkpoint import Checkpoint

from paged_helpers import run_draft, run_target

# f32 graphs and cache against the float64 reference measure NMSE 5e-14..8e-13 on every case here (AVX-512 and
# AVX2 alike); any real formula error (a wrong frequency, eps outside the root, a scale on cos only) lands far above.
RNG = np.random.default_rng(11)
# Prefill of two sequences (one past a 32-token cache block), verification rows partly rolled back, decode.
TARGET_SCHEDULE = [
    [(0, RNG.integers(0, 256, 9).tolist(), 9), (1, RNG.integers(0, 256, 40).tolist(), 40)],
    [(1, RNG.integers(0, 256, 5).tolist(), 2), (0, RNG.integers(0, 256, 3).tolist(), 3)],
    [(0, RNG.integers(0, 256, 1).tolist(), 1), (1, RNG.integers(0, 256, 1).tolist(), 1)],
]
# yarn and llama3 with a small original context (64), so the tiny head_dim spans kept, ramped and scaled frequencies
TARGET_CASES = {
    "yarn rope_scaling": dict(
        rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}
    ),
    "yarn rope_parameters, mscale, no truncation": dict(
        rope_theta=None,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 500.0,
            "factor": 8.0,
            "original_max_position_embeddings": 32,
            "mscale": 1.0,
            "mscale_all_dim": 0.5,
            "beta_fast": 16.0,
            "beta_slow": 2.0,
            "truncate": False,
        },
    ),
    "yarn legacy type key, attention_factor, original from max_position_embeddings": dict(
        max_position_embeddings=48, rope_scaling={"type": "yarn", "factor": 2.0, "attention_factor": 1.3}
    ),
    "yarn without factor: the stretch max_position_embeddings / original": dict(
        max_position_embeddings=256, rope_scaling={"rope_type": "yarn", "original_max_position_embeddings": 64}
    ),
    "linear": dict(rope_scaling={"type": "linear", "factor": 3.0}),
    "llama3": dict(
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        }
    ),
    "eps 0.1, theta 100": dict(rms_norm_eps=0.1, rope_theta=100.0),
    "tied embeddings, head_dim derived": dict(tie_word_embeddings=True, head_dim=None),
    "windows from max_window_layers": dict(
        layer_types=None, use_sliding_window=True, sliding_window=6, max_window_layers=1
    ),
}
TWO_LAYERS = dict(num_hidden_layers=2, layer_types=["full_attention"] * 2)  # enough for a config's branches


def draft_schedule(block_size: int, mask: int = MASK_ID) -> list:
    """(seq, context rows, block): full blocks, a context-only step, a short block, a sequence past a cache block."""
    full = [[a] + [mask] * (block_size - 1) for a in (11, 12, 13, 14, 15)]
    return [
        [(0, 6, full[0]), (1, 35, full[1])],
        [(1, 2, full[2]), (0, 3, [])],
        [(0, 1, full[3][:2]), (1, 1, full[4])],
    ]


@pytest.mark.parametrize("case", list(TARGET_CASES))
def test_target_config_matches_reference(case, tmp_path):
    folder = write_tiny_target(tmp_path / "t", **{**TWO_LAYERS, **TARGET_CASES[case]})
    cfg, weights = load_target(Checkpoint.open(folder))
    model = PagedModel(build_target(cfg, weights, (0, 1)), kv_cache_precision="f32")
    out = run_target(model, Qwen3Reference(cfg, weights), (0, 1), TARGET_SCHEDULE)
    logits, hidden = out.nmse("logits"), out.nmse("hidden_states")
    print(f"{case}: logits NMSE {logits:.1e}, hidden {hidden:.1e}")
    assert logits < F32_NMSE and hidden < F32_NMSE, f"{case}: logits NMSE {logits:.1e}, hidden {hidden:.1e}"


def test_config_cases_reach_their_branches():
    """The cases above really take the branches they name (a case falling back to defaults would prove nothing)."""
    seen = {c: parse_target_config({**TINY_TARGET, **TWO_LAYERS, **o}, "t") for c, o in TARGET_CASES.items()}
    assert [c.rope.rope_type for c in seen.values()][:6] == ["yarn", "yarn", "yarn", "yarn", "linear", "llama3"]
    assert seen["yarn without factor: the stretch max_position_embeddings / original"].rope.factor == 4.0
    assert not seen["yarn rope_parameters, mscale, no truncation"].rope.truncate
    assert seen["eps 0.1, theta 100"].rms_norm_eps == 0.1
    assert seen["tied embeddings, head_dim derived"].head_dim == 16
    assert seen["windows from max_window_layers"].sliding_windows == (0, 6)


# DFlash v1 drafts: flat keys (no dflash_config) with taps derived from num_target_layers; causal llama3.
DFLASH_CASES = {
    "yarn, eps 0.1, flat keys, default taps": dict(
        dflash_config=None,
        mask_token_id=MASK_ID,
        block_size=6,
        rms_norm_eps=0.1,
        rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
    ),
    "llama3, causal": dict(
        is_causal=True,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 4.0,
            "low_freq_factor": 2.0,
            "high_freq_factor": 8.0,
            "original_max_position_embeddings": 128,
        },
    ),
    "linear rope_parameters": dict(
        rope_theta=None, rope_parameters={"rope_type": "linear", "rope_theta": 1000.0, "factor": 2.5}
    ),
}


@pytest.mark.parametrize("case", list(DFLASH_CASES))
def test_dflash_config_matches_reference(case, tmp_path, target):
    dcfg, dweights = load_draft(Checkpoint.open(write_tiny_dflash(tmp_path / "d", **DFLASH_CASES[case])))
    model = PagedModel(build_dflash_draft(dcfg, dweights, target[1]), kv_cache_precision="f32")
    out = run_draft(model, DRAFT_REFERENCES["dflash"](dcfg, dweights, target[1]), draft_schedule(dcfg.block_size))
    logits, hidden = out.nmse("logits"), out.nmse("last_hidden_state")
    print(f"dflash {case}: logits NMSE {logits:.1e}, hidden {hidden:.1e}")
    assert logits < F32_NMSE and hidden < F32_NMSE, f"{case}: logits NMSE {logits:.1e}, hidden {hidden:.1e}"
    if "default taps" in case:
        assert dcfg.target_layer_ids == (1, 3) and dcfg.block_size == 6 and dcfg.rms_norm_eps == 0.1


DRAFT_FAMILY_CASES = {
    "dflash2 yarn, eps 0.1": (
        write_tiny_dflash2,
        dict(
            rms_norm_eps=0.1,
            rope_parameters={
                "rope_type": "yarn",
                "rope_theta": 10000.0,
                "factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        ),
    ),
    "dspark linear, eps 0.1, confidence without Markov features": (
        lambda folder, **o: write_tiny_dspark(folder, "gated", **o),
        dict(rms_norm_eps=0.1, rope_scaling={"type": "linear", "factor": 2.0}, confidence_head_with_markov=False),
    ),
}


@pytest.mark.parametrize("case", list(DRAFT_FAMILY_CASES))
def test_draft_family_config_matches_reference(case, tmp_path, target):
    write, overrides = DRAFT_FAMILY_CASES[case]
    dcfg, dweights = load_draft(Checkpoint.open(write(tmp_path / "d", **overrides)))
    backbone = next(iter(build_draft_models(dcfg, dweights, target[1]).values()))
    model = PagedModel(backbone, kv_cache_precision="f32")
    ref = DRAFT_REFERENCES[dcfg.family](dcfg, dweights, target[1])
    out = run_draft(model, ref, draft_schedule(dcfg.block_size))
    logits, hidden = out.nmse("logits"), out.nmse("last_hidden_state")
    print(f"{case}: logits NMSE {logits:.1e}, hidden {hidden:.1e}")
    assert dcfg.rope.rope_type != "default" and dcfg.rms_norm_eps == 0.1
    assert logits < F32_NMSE and hidden < F32_NMSE, f"{case}: logits NMSE {logits:.1e}, hidden {hidden:.1e}"

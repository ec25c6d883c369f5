"""The numpy reference models: the equivalences the golden reference must satisfy."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np

import ovbuild.reference
from ovbuild.families import load_draft
from ovbuild.reference import dflash as reference_dflash
from ovbuild.reference.dflash import DFlashReference
from ovbuild.reference.qwen3 import Qwen3Reference
from ovbuild.targets import load_target
from ovbuild.testing import nmse, write_tiny_dflash
from ovbuild.weights.checkpoint import Checkpoint

F64_NMSE = 1e-24  # two float64 computations of the same thing, summed in another order
PROMPT = np.array([72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100, 33, 10, 100, 101, 102])


def test_incremental_decode_equals_full_recompute(target, draft):
    ref = Qwen3Reference(*target)
    taps_ids = draft[0].target_layer_ids
    full_logits, full_taps = ref.forward(ref.new_cache(), PROMPT, taps_ids)
    cache = ref.new_cache()
    parts = [ref.forward(cache, chunk, taps_ids) for chunk in np.split(PROMPT, [9, 12, 13, 16])]
    logits = np.concatenate([p[0] for p in parts])
    taps = np.concatenate([p[1] for p in parts])
    print(
        f"incremental vs full recompute: logits NMSE {nmse(logits, full_logits):.1e}, taps {nmse(taps, full_taps):.1e}"
    )
    # float64 against float64: measured 6e-31 (only the summation order differs)
    assert nmse(logits, full_logits) < F64_NMSE, nmse(logits, full_logits)
    assert nmse(taps, full_taps) < F64_NMSE, nmse(taps, full_taps)


def test_rolled_back_cache_equals_never_having_seen_the_tokens(target):
    ref = Qwen3Reference(*target)
    cache = ref.new_cache()
    ref.forward(cache, PROMPT[:10])
    ref.forward(cache, np.array([3, 4, 5]))
    cache.truncate(10)
    rolled, _ = ref.forward(cache, PROMPT[10:])
    fresh, _ = ref.forward(ref.new_cache(), PROMPT)
    assert nmse(rolled, fresh[10:]) < F64_NMSE, nmse(rolled, fresh[10:])


def test_last_layer_tap_is_taken_after_the_final_norm(target):
    cfg, weights = target
    ref = Qwen3Reference(cfg, weights)
    _, last = ref.forward(ref.new_cache(), PROMPT, (cfg.num_layers - 1,))
    rms = np.sqrt(np.mean((last / ref.norm) ** 2, axis=-1))
    assert np.allclose(rms, 1.0, atol=1e-4)


def test_draft_step_in_one_call_equals_context_then_block(target, draft):
    dcfg, dweights = draft
    tref, dref = Qwen3Reference(*target), DFlashReference(dcfg, dweights, target[1])
    _, taps = tref.forward(tref.new_cache(), PROMPT, dcfg.target_layer_ids)
    block = np.array([int(PROMPT[-1])] + [dcfg.mask_token_id] * (dcfg.block_size - 1))
    one = dref.new_cache()
    logits_one, hidden_one = dref.forward(one, taps, block)
    split = dref.new_cache()
    dref.forward(split, taps[:11], block[:0])
    dref.forward(split, taps[11:], block[:0])
    logits_split, hidden_split = dref.forward(split, taps[:0], block)
    print(f"draft step in one call vs context then block: logits NMSE {nmse(logits_split, logits_one):.1e}")
    assert logits_one.shape == (dcfg.block_size - 1, dcfg.vocab_size)
    assert nmse(logits_split, logits_one) < F64_NMSE and nmse(hidden_split, hidden_one) < F64_NMSE
    assert one.length == split.length == len(PROMPT)


def test_block_rows_see_each_other_and_context_but_leave_no_trace(target, draft):
    dcfg, dweights = draft
    dref = DFlashReference(dcfg, dweights, target[1])
    taps = np.random.default_rng(0).standard_normal((5, dcfg.num_taps * dcfg.target_hidden_size))
    cache = dref.new_cache()
    dref.forward(cache, taps, np.array([], np.int64))
    a, _ = dref.forward(cache, taps[:0], np.array([7, 257, 257, 257]))
    b, _ = dref.forward(cache, taps[:0], np.array([7, 257, 257, 9]))  # a later row changes earlier rows' outputs
    assert cache.length == 5
    assert nmse(b[0], a[0]) > 1e-6
    c, _ = dref.forward(cache, taps[:0], np.array([7, 257, 257, 257]))
    assert np.array_equal(a, c)


def test_bf16_checkpoint_matches_f32_within_bf16_rounding(tiny_target, tiny_target_bf16, tiny_draft, tiny_draft_bf16):
    results = []
    for t, d in ((tiny_target, tiny_draft), (tiny_target_bf16, tiny_draft_bf16)):
        tcfg, tw = load_target(Checkpoint.open(t))
        dcfg, dw = load_draft(Checkpoint.open(d))
        tref, dref = Qwen3Reference(tcfg, tw), DFlashReference(dcfg, dw, tw)
        logits, taps = tref.forward(tref.new_cache(), PROMPT, dcfg.target_layer_ids)
        dlogits, _ = dref.step(dref.new_cache(), taps, int(PROMPT[-1]))
        results.append((logits, dlogits))
    (t32, d32), (t16, d16) = results
    print(f"bf16 vs f32 checkpoint: target logits NMSE {nmse(t16, t32):.1e}, draft {nmse(d16, d32):.1e}")
    # bf16 keeps 8 mantissa bits: relative weight error ~2^-9, so the output NMSE sits near 1e-5
    # measured 4.6e-5 (target) and 2.9e-5 (draft)
    assert 1e-6 < nmse(t16, t32) < 5e-4, nmse(t16, t32)
    assert 1e-6 < nmse(d16, d32) < 5e-4, nmse(d16, d32)


def test_reference_shares_no_builder_rope_or_reader_code():
    """The reference imports neither graph builders nor the builders' RoPE or checkpoint reader: parity between
    two things that share code proves nothing about that code."""
    forbidden = (
        "ovbuild.graph",
        "ovbuild.weights.rope",
        "ovbuild.weights.safetensors_file",
        "ovbuild.weights.checkpoint",
        "ovbuild.weights.dtypes",
        "ovbuild.weights.tensor",
    )
    for path in sorted(Path(ovbuild.reference.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                modules = [node.module or ""]
            else:
                continue
            bad = [m for m in modules for f in forbidden if m == f or m.startswith(f + ".")]
            assert not bad, f"{path.name} imports {bad}"


def test_windowed_block_mask_is_the_authors_rule(tmp_path, target, monkeypatch):
    """z-lab's DFlash mask for a non-causal sliding layer: key k visible to query q iff q - k < W and k - q < W.

    Context rows 0..2, then a 6-row block at 3..8 with W = 3: written out by hand, block keys are windowed both ways.
    """
    sliding = dict(layer_types=["sliding_attention", "full_attention"], use_sliding_window=True, is_causal=False)
    dcfg, dweights = load_draft(Checkpoint.open(write_tiny_dflash(tmp_path / "d", sliding_window=3, **sliding)))
    masks, attention = [], reference_dflash.attention

    def recording(q, k, v, mask):
        masks.append(mask)
        return attention(q, k, v, mask)

    monkeypatch.setattr(reference_dflash, "attention", recording)
    ref = DFlashReference(dcfg, dweights, target[1])
    taps = np.random.default_rng(0).standard_normal((3, dcfg.num_taps * dcfg.target_hidden_size))
    ref.forward(ref.new_cache(), taps, np.array([7] + [257] * 5))
    visible = {
        3: [1, 2, 3, 4, 5],
        4: [2, 3, 4, 5, 6],
        5: [3, 4, 5, 6, 7],
        6: [4, 5, 6, 7, 8],
        7: [5, 6, 7, 8],
        8: [6, 7, 8],
    }
    assert {q: np.flatnonzero(row).tolist() for q, row in zip(range(3, 9), masks[0], strict=True)} == visible
    assert masks[1].all(), "the full layer hides nothing"

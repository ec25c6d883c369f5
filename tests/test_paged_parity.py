"""Compiled paged IRs (f32 KV cache) against the numpy reference over packed multi-sequence schedules."""

from __future__ import annotations

import numpy as np
import openvino as ov
import pytest

from ovbuild.families import load_draft
from ovbuild.graph.dflash import build_dflash_draft
from ovbuild.graph.target import build_target
from ovbuild.ir import read_ir, save_ir
from ovbuild.reference.dflash import DFlashReference
from ovbuild.reference.qwen3 import Qwen3Reference
from ovbuild.runtime.cache.kv_cache import SequenceRows
from ovbuild.runtime.model.padding import DRAFT_PADDING
from ovbuild.runtime.model.paged_model import TAPS, PagedModel, taps_in_math_precision
from ovbuild.targets import load_target
from ovbuild.testing import F32_NMSE, nmse, write_tiny_dflash, write_tiny_target
from ovbuild.weights.checkpoint import Checkpoint

from paged_helpers import run_draft, run_target

RNG = np.random.default_rng(7)


def tokens(n: int) -> list[int]:
    return RNG.integers(0, 256, n).tolist()


# Prefill of 3 sequences (one crosses a 32-token block) -> chunk, decode, 5 verification rows of which 2 are kept
# -> decode after rollback, the rolled-back slots overwritten -> a 4th sequence joins while another decodes.
TARGET_SCHEDULE = [
    [(0, tokens(5), 5), (1, tokens(37), 37), (2, tokens(12), 12)],
    [(0, tokens(9), 9), (1, tokens(1), 1), (2, tokens(5), 2)],
    [(2, tokens(1), 1), (0, tokens(1), 1), (1, tokens(30), 30)],
    [(3, tokens(3), 3), (1, tokens(1), 1), (0, tokens(6), 6), (2, tokens(4), 4)],
]
# (seq, context rows, block): blocks of 8 rows; a step with only context, one with only a block, a 1-row block.
MASK = 257
DRAFT_SCHEDULE = [
    [(0, 5, [11] + [MASK] * 7), (1, 37, [12] + [MASK] * 7), (2, 12, [13] + [MASK] * 7)],
    [(0, 3, [14] + [MASK] * 7), (1, 1, [15] + [MASK] * 7), (2, 0, [16] + [MASK] * 7)],
    [(2, 8, [17] + [MASK] * 7), (0, 2, []), (1, 30, [18, MASK])],
    [(1, 4, [19] + [MASK] * 7), (0, 1, [20] + [MASK] * 7), (3, 6, [21] + [MASK] * 7)],
]


# How a PagedModel runs its calls: the dynamic-shape model as they come; the dynamic model, every call whose row count
# differs from the recent ones with a padding sequence (ovbuild.runtime.model.padding); static copies per row count
# (ovbuild.runtime.model.static_rows, what CPU models this small run by default).
CALLS = {
    "unpadded": dict(static_rows=False),
    "padded": dict(padding=DRAFT_PADDING, static_rows=False),
    "static": dict(static_rows=True),
}


def target_pair(cfg_weights, taps=(1, 3, 5), calls="static"):
    cfg, weights = cfg_weights
    model = PagedModel(build_target(cfg, weights, taps), kv_cache_precision="f32", **CALLS[calls])
    return model, Qwen3Reference(cfg, weights)


@pytest.mark.parametrize("calls", list(CALLS))
def test_target_matches_reference(target, calls):
    model, ref = target_pair(target, calls=calls)
    out = run_target(model, ref, (1, 3, 5), TARGET_SCHEDULE)
    print(f"paged target vs reference: logits NMSE {out.nmse('logits'):.2e}, hidden {out.nmse('hidden_states'):.2e}")
    assert out.nmse("logits") < F32_NMSE, f"logits NMSE {out.nmse('logits'):.2e}"
    assert out.nmse("hidden_states") < F32_NMSE, f"hidden_states NMSE {out.nmse('hidden_states'):.2e}"
    for call in out.ir:
        for seq in call.values():
            assert np.array_equal(seq["greedy_ids"], seq["logits"].argmax(-1))


def test_one_row_subsequences_see_the_rows_before_them_in_the_call(target):
    """Every row of every sequence as a 1-row subsequence (how the scheduler verifies on CPU): each row attends to the
    rows its sequence's earlier subsequences write in the same call, as the reference's rows do."""
    model, ref = target_pair(target)
    out = run_target(model, ref, (1, 3, 5), TARGET_SCHEDULE, row_subsequences=True)
    print(f"1-row subsequences vs reference: logits NMSE {out.nmse('logits'):.2e}")
    assert out.nmse("logits") < F32_NMSE, f"logits NMSE {out.nmse('logits'):.2e}"
    assert out.nmse("hidden_states") < F32_NMSE, f"hidden_states NMSE {out.nmse('hidden_states'):.2e}"


@pytest.mark.parametrize("math", ["f32", "bf16"])
def test_taps_leave_the_logits_of_the_target_alone(target, math):
    """A target built with taps computes bitwise the logits of the same target built without them, in f32 and in
    bf16 math (f32 on a CPU without bf16 units): a tap must not change how the plugin runs the layers it reads, or
    speculative output would differ from the target alone's. Its taps come back as f32 numbers near the reference's."""
    cfg, weights = target
    tapped, alone = (PagedModel(build_target(cfg, weights, taps), "CPU", "f16", math) for taps in ((1, 3, 5), ()))
    rows = [SequenceRows(0, 0, 17), SequenceRows(1, 0, 9)]
    inputs = {"input_ids": tokens(26), "position_ids": [*range(17), *range(9)], "logits_indices": list(range(26))}
    with_taps = tapped.run(rows, inputs)
    assert np.array_equal(with_taps["logits"], alone.run(rows, inputs)["logits"])
    ref = Qwen3Reference(cfg, weights)
    _, hidden = ref.forward(ref.new_cache(), np.array(inputs["input_ids"][:17]), (1, 3, 5))
    assert with_taps["hidden_states"].dtype == np.float32
    assert nmse(with_taps["hidden_states"][:17], hidden) < 1e-3  # bf16 math through the layers: about 1e-4


def test_taps_leave_the_graph_in_bf16_where_the_plugin_computes_in_bf16(target, bf16_units):
    """The rule behind the test above, on a CPU with bf16 units whatever this one has (on one without, the plugin
    computes in f32 and the tokens cannot show it): under bf16 math on CPU the model compiled has its taps output in
    bf16, in a copy; under f32 math, or on another device, the model is left as it is."""
    model = build_target(*target, (1, 3, 5))
    changed, outputs = taps_in_math_precision(model, "CPU", "bf16")
    assert outputs == (TAPS,) and changed.output(TAPS).get_element_type() == ov.Type.bf16
    assert model.output(TAPS).get_element_type() == ov.Type.f32, "the caller's model was changed"
    assert changed.output("logits").get_element_type() == ov.Type.f32
    for device, math in (("CPU", "f32"), ("GPU", "bf16")):
        assert taps_in_math_precision(model, device, math) == (model, ()), f"{device} at {math} math"


@pytest.mark.parametrize("calls", list(CALLS))
def test_draft_matches_reference(target, draft, calls):
    dcfg, dweights = draft
    model = PagedModel(build_dflash_draft(dcfg, dweights, target[1]), kv_cache_precision="f32", **CALLS[calls])
    out = run_draft(model, DFlashReference(dcfg, dweights, target[1]), DRAFT_SCHEDULE)
    print(f"paged draft vs reference: logits NMSE {out.nmse('logits'):.2e}, hidden {out.nmse('last_hidden_state'):.2e}")
    assert out.nmse("logits") < F32_NMSE, f"logits NMSE {out.nmse('logits'):.2e}"
    assert out.nmse("last_hidden_state") < F32_NMSE, f"last_hidden_state NMSE {out.nmse('last_hidden_state'):.2e}"


def test_bf16_checkpoints_match_reference(tiny_target_bf16, tiny_draft_bf16):
    """f32 graphs on bf16 weights compute with exactly the widened values the reference reads through `safetensors`
    (its own bf16 decoding), so the f32 bound holds; a reader mistake (e.g. a transposed square tensor) cannot hide."""
    t = load_target(Checkpoint.open(tiny_target_bf16))
    d = load_draft(Checkpoint.open(tiny_draft_bf16))
    model, ref = target_pair(t)
    out = run_target(model, ref, (1, 3, 5), TARGET_SCHEDULE)
    dmodel = PagedModel(build_dflash_draft(d[0], d[1], t[1]), kv_cache_precision="f32")
    dout = run_draft(dmodel, DFlashReference(d[0], d[1], t[1]), DRAFT_SCHEDULE)
    figures = f"target logits NMSE {out.nmse('logits'):.1e}, draft {dout.nmse('logits'):.1e}"
    print(f"bf16 checkpoints, f32 graphs: {figures}")
    assert out.nmse("logits") < F32_NMSE and dout.nmse("logits") < F32_NMSE, figures


def test_sliding_window_layers_match_reference(tmp_path):
    sliding = dict(use_sliding_window=True, sliding_window=6)
    t = load_target(
        Checkpoint.open(
            write_tiny_target(tmp_path / "t", layer_types=["sliding_attention", "full_attention"] * 3, **sliding)
        )
    )
    # A causal sliding layer (window below the block size) and a bidirectional full layer
    d = load_draft(
        Checkpoint.open(
            write_tiny_dflash(tmp_path / "d", layer_types=["sliding_attention", "full_attention"], **sliding)
        )
    )
    assert t[0].sliding_windows[0] == 6 and d[0].sliding_windows == (6, 0) and d[0].layer_causal == (True, False)
    model, ref = target_pair(t)
    out = run_target(model, ref, (1, 3, 5), TARGET_SCHEDULE)
    assert out.nmse("logits") < F32_NMSE, f"target logits NMSE {out.nmse('logits'):.2e}"
    dmodel = PagedModel(build_dflash_draft(d[0], d[1], t[1]), kv_cache_precision="f32")
    dout = run_draft(dmodel, DFlashReference(d[0], d[1], t[1]), DRAFT_SCHEDULE)
    print(f"sliding window 6: target logits NMSE {out.nmse('logits'):.2e}, draft {dout.nmse('logits'):.2e}")
    assert dout.nmse("logits") < F32_NMSE, f"draft logits NMSE {dout.nmse('logits'):.2e}"


@pytest.mark.parametrize("window", [8, 3])
def test_bidirectional_sliding_layers_match_reference(tmp_path, target, window):
    """Windows at and below the block (8): block rows `window` or more apart do not see each other."""
    d = load_draft(
        Checkpoint.open(
            write_tiny_dflash(
                tmp_path / "d",
                layer_types=["sliding_attention"] * 2,
                use_sliding_window=True,
                sliding_window=window,
                is_causal=False,
            )
        )
    )
    assert d[0].layer_causal == (False, False)
    dmodel = PagedModel(build_dflash_draft(d[0], d[1], target[1]), kv_cache_precision="f32")
    dout = run_draft(dmodel, DFlashReference(d[0], d[1], target[1]), DRAFT_SCHEDULE)
    print(f"bidirectional window {window}, block 8: draft logits NMSE {dout.nmse('logits'):.2e}")
    assert dout.nmse("logits") < F32_NMSE, f"draft logits NMSE {dout.nmse('logits'):.2e}"


def test_saved_and_read_ir_matches_reference(tmp_path, target, draft):
    dcfg, dweights = draft
    model, ref = target_pair(target)
    tpath = save_ir(build_target(target[0], target[1], (1, 3, 5)), tmp_path / "target" / "openvino_model.xml")
    dpath = save_ir(build_dflash_draft(dcfg, dweights, target[1]), tmp_path / "draft" / "openvino_model.xml")
    t_read = PagedModel(read_ir(tpath.parent), kv_cache_precision="f32")
    d_read = PagedModel(read_ir(dpath.parent), kv_cache_precision="f32")
    in_memory = run_target(model, ref, (1, 3, 5), TARGET_SCHEDULE)
    from_disk = run_target(t_read, ref, (1, 3, 5), TARGET_SCHEDULE)
    assert from_disk.nmse("logits") < F32_NMSE, f"target read from disk: logits NMSE {from_disk.nmse('logits'):.1e}"
    for a, b in zip(in_memory.ir, from_disk.ir, strict=True):
        for seq in a:
            assert np.array_equal(a[seq]["logits"], b[seq]["logits"]), "file and in-memory builds differ"
    dref = DFlashReference(dcfg, dweights, target[1])
    d_nmse = run_draft(d_read, dref, DRAFT_SCHEDULE).nmse("logits")
    assert d_nmse < F32_NMSE, f"draft read from disk: logits NMSE {d_nmse:.1e}"


def test_sequences_are_isolated(target, draft):
    dcfg, dweights = draft
    model, ref = target_pair(target)
    base = run_target(model, ref, (1, 3, 5), TARGET_SCHEDULE)
    changed_schedule = [[(s, list(reversed(t)) if s == 1 else t, c) for s, t, c in call] for call in TARGET_SCHEDULE]
    model2, _ = target_pair(target)
    changed = run_target(model2, ref, (1, 3, 5), changed_schedule)
    for a, b in zip(base.ir, changed.ir, strict=True):
        for seq in a:
            same = all(np.array_equal(a[seq][k], b[seq][k]) for k in a[seq])
            assert same == (seq != 1), f"sequence {seq} {'changed' if not same else 'unchanged'}"
    dmodel = PagedModel(build_dflash_draft(dcfg, dweights, target[1]), kv_cache_precision="f32")
    dref = DFlashReference(dcfg, dweights, target[1])
    dbase = run_draft(dmodel, dref, DRAFT_SCHEDULE, seed=0)
    changed_draft = [[(s, n, [99, *b[1:]] if s == 0 and b else b) for s, n, b in call] for call in DRAFT_SCHEDULE]
    dmodel2 = PagedModel(build_dflash_draft(dcfg, dweights, target[1]), kv_cache_precision="f32")
    dchanged = run_draft(dmodel2, dref, changed_draft, seed=0)
    for a, b in zip(dbase.ir, dchanged.ir, strict=True):
        for seq in a:
            if seq != 0:
                assert all(np.array_equal(a[seq][k], b[seq][k]) for k in a[seq]), f"draft sequence {seq} changed"


def test_u8_cache_keeps_greedy_tokens_except_near_ties(target):
    """The default u8 cache quantizes keys and values; greedy tokens may only flip where the reference nearly ties."""
    cfg, weights = target
    model = PagedModel(build_target(cfg, weights, (1, 3, 5)), kv_cache_precision="u8", inference_precision="f32")
    out = run_target(model, Qwen3Reference(cfg, weights), (1, 3, 5), TARGET_SCHEDULE)
    ir = np.concatenate([c[s]["logits"] for c in out.ir for s in sorted(c)])
    ref = np.concatenate([c[s]["logits"] for c in out.ref for s in sorted(c)])
    top2 = np.sort(ref, axis=-1)[:, -2:]
    margins = (top2[:, 1] - top2[:, 0]) / ref.std()
    flipped = ir.argmax(-1) != ref.argmax(-1)
    print(
        f"u8 KV cache: logits NMSE {out.nmse('logits'):.2e}, {flipped.sum()} of {len(flipped)} greedy tokens "
        f"flipped, reference margins there {np.round(margins[flipped], 4).tolist()}"
    )
    # measured 3.5e-5 (AVX-512 and AVX2)
    assert out.nmse("logits") < 5e-4, f"u8 KV cache logits NMSE {out.nmse('logits'):.2e} (measured 3.5e-5)"
    assert flipped.mean() < 0.05 and np.all(margins[flipped] < 0.01), (
        f"greedy tokens flipped beyond near-ties: margins {margins[flipped]}"
    )

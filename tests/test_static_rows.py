"""Static row counts (ovbuild.runtime.model.static_rows): copies compiled per row count against the numpy reference,
calls cut into parts, and rows that compute bitwise alike whatever call they come in."""

from __future__ import annotations

import numpy as np
import pytest

from ovbuild.errors import UnsupportedError
from ovbuild.graph.dflash import build_dflash_draft
from ovbuild.graph.target import build_target
from ovbuild.reference.dflash import DFlashReference
from ovbuild.reference.qwen3 import Qwen3Reference
from ovbuild.runtime.cache.kv_cache import SequenceRows
from ovbuild.runtime.model import narrow_weights, static_rows
from ovbuild.runtime.model.devices import target_inference_precision
from ovbuild.runtime.model.padding import PAD_SEQUENCE
from ovbuild.runtime.model.paged_model import PagedModel
from ovbuild.runtime.model.static_rows import COPY_ROWS as BUCKETS
from ovbuild.runtime.model.static_rows import copy_size as bucket
from ovbuild.runtime.model.static_rows import parts
from ovbuild.runtime.request import GenerationConfig
from ovbuild.runtime.scheduler import Scheduler
from ovbuild.runtime.speculation.drafters import BlockDrafter
from ovbuild.runtime.speculation.planner import Speculation
from ovbuild.targets import load_target
from ovbuild.testing import F32_NMSE
from ovbuild.weights.checkpoint import Checkpoint

from paged_helpers import run_draft, run_target

RNG = np.random.default_rng(11)
TAPS = (1, 3, 5)
LONG = BUCKETS[-1] + 6  # a prompt chunk longer than the largest copy: it runs in the dynamic model


def tokens(n: int) -> list[int]:
    return RNG.integers(0, 256, n).tolist()


# A long prompt chunk with short ones and a single row (cut into a dynamic part and a static one), then chunks that
# together exceed the largest copy (two static parts), then single rows alone (padded from 1 to 2 rows).
SCHEDULE = [
    [(0, tokens(LONG), LONG), (1, tokens(7), 7), (2, tokens(1), 1)],
    [(0, tokens(40), 40), (1, tokens(30), 30), (2, tokens(9), 5)],
    [(1, tokens(1), 1)],
    [(2, tokens(1), 1), (0, tokens(2), 1)],
]


def test_parts_keep_long_subsequences_dynamic_and_fill_copies_in_order():
    rows = [SequenceRows(0, 0, LONG), SequenceRows(1, 0, 40), SequenceRows(2, 0, 30), SequenceRows(3, 0, 1)]
    assert parts(rows) == [([0], False), ([1], True), ([2, 3], True)]
    ones = [SequenceRows(s, 0, 1) for s in range(BUCKETS[-1] + 1)]
    assert parts(ones) == [(list(range(BUCKETS[-1])), True), ([BUCKETS[-1]], True)]
    assert [bucket(n) for n in (1, 2, 5, 17, BUCKETS[-1])] == [2, 2, 6, 24, BUCKETS[-1]]


# Copies each schedule compiles. Chunks: 7 + 1 rows; 40, then 30 + 9 (79 exceed the largest copy); 1 row padded to 2;
# 1 + 2 rows. Every row a 1-row subsequence: 78 and 79 rows fill a 64-row part and a 16-row one.
COPIES = {False: {8, 48, 2, 3}, True: {64, 16, 2, 3}}


@pytest.mark.parametrize("row_subsequences", [False, True], ids=["chunks", "rows"])
def test_target_in_static_copies_matches_reference(target, row_subsequences):
    cfg, weights = target
    model = PagedModel(build_target(cfg, weights, TAPS), kv_cache_precision="f32", static_rows=True)
    out = run_target(model, Qwen3Reference(cfg, weights), TAPS, SCHEDULE, row_subsequences=row_subsequences)
    print(f"static copies vs reference: logits NMSE {out.nmse('logits'):.2e}, taps {out.nmse('hidden_states'):.2e}")
    assert out.nmse("logits") < F32_NMSE, f"logits NMSE {out.nmse('logits'):.2e}"
    assert out.nmse("hidden_states") < F32_NMSE, f"taps NMSE {out.nmse('hidden_states'):.2e}"
    assert set(model.static.copies) == COPIES[row_subsequences], f"copies compiled: {sorted(model.static.copies)}"
    assert model.cache.allocator.tables.keys() == {0, 1, 2}, "the padding rows' blocks are not the pool's"


def test_draft_in_static_copies_matches_reference(target, draft):
    cfg, weights = draft
    model = PagedModel(build_dflash_draft(cfg, weights, target[1]), kv_cache_precision="f32", static_rows=True)
    mask = cfg.mask_token_id
    schedule = [  # (seq, context rows, block): 78 rows, then a long context, then a 1-row block
        [(0, 5, [11] + [mask] * 7), (1, 37, [12] + [mask] * 7), (2, 12, [13] + [mask] * 7)],
        [(0, LONG, [14] + [mask] * 7), (1, 3, [15, mask])],
        [(2, 0, [16]), (1, 2, [])],
    ]
    out = run_draft(model, DFlashReference(cfg, weights, target[1]), schedule)
    print(f"static draft copies vs reference: logits NMSE {out.nmse('logits'):.2e}")
    assert out.nmse("logits") < F32_NMSE, f"logits NMSE {out.nmse('logits'):.2e}"
    assert out.nmse("last_hidden_state") < F32_NMSE, f"last hidden NMSE {out.nmse('last_hidden_state'):.2e}"


def rows_in_calls(model: PagedModel, context: list[int], new: list[int], width: int, beside: int) -> np.ndarray:
    """Logits of `new` after `context` (sequence 0), `width` rows per call, each row a 1-row subsequence, every call
    beside a fresh prompt chunk of `beside` rows of another sequence (0: alone)."""
    allocator = model.cache.allocator
    for seq in (0, 1):
        allocator.free(seq)
        allocator.reserve(seq, 256)
    n = len(context)
    model.run([SequenceRows(0, 0, n)], {"input_ids": context, "position_ids": list(range(n)), "logits_indices": [0]})
    logits = []
    for start in range(0, len(new), width):
        chunk = new[start : start + width]
        rows = [SequenceRows(0, n + start + i, 1) for i in range(len(chunk))]
        ids, positions = list(chunk), list(range(n + start, n + start + len(chunk)))
        if beside:
            rows.append(SequenceRows(1, 0, beside))
            ids += tokens(beside)
            positions += range(beside)
        out = model.run(rows, {"input_ids": ids, "position_ids": positions, "logits_indices": list(range(len(chunk)))})
        logits.append(np.array(out["logits"]))
    return np.concatenate(logits)


@pytest.mark.parametrize(
    "requested, stored, short_of_memory",
    [("f32", "f32", False), (None, "f32", False), (None, "bf16", False), ("f32", "bf16", True)],
    ids=["f32", "default", "default-bf16-weights", "f32-bf16-weights-kept-narrow"],
)
def test_rows_compute_bitwise_alike_in_any_call(
    target, tiny_target_bf16, requested, stored, short_of_memory, monkeypatch
):
    """What keeps speculation exact: a verification row must compute as the target alone's decode row does, whatever
    else its call holds. With copies it does, bitwise, at 1 to 12 rows per call, beside a prompt chunk that runs in
    the dynamic model or in a copy: at f32 math, and at the math ovbuild picks for this CPU (bf16 where that was
    measured exact: with AVX-512 bf16 units and no AMX; f32 elsewhere); with bf16 weights too, kept narrow where the
    math is bf16, and under f32 math on a machine too small for them widened (ovbuild.runtime.model.narrow_weights)."""
    if short_of_memory:
        monkeypatch.setattr(narrow_weights, "physical_memory_mb", lambda: 1.0)
    checkpoint = Checkpoint.open(tiny_target_bf16) if stored == "bf16" else None
    cfg, weights = load_target(checkpoint) if checkpoint is not None else target
    math = target_inference_precision("CPU", requested, "f16")
    model = PagedModel(build_target(cfg, weights, TAPS), "CPU", "f16", math, static_rows=True)
    context, new = tokens(40), tokens(12)
    alone = rows_in_calls(model, context, new, 1, 0)
    for width, beside in ((2, 0), (3, 0), (12, 0), (1, LONG), (5, 20), (12, LONG)):
        got = rows_in_calls(model, context, new, width, beside)
        assert np.array_equal(got, alone), (
            f"{math}: {width} rows per call beside {beside} prompt rows differ from 1-row calls by "
            f"{np.abs(got - alone).max():.3g}"
        )
    assert PAD_SEQUENCE not in model.cache.allocator.tables


def test_calls_that_compile_a_copy_stay_out_of_the_cost_curves(target, draft):
    """A call that compiles a copy for its row count costs many steady calls: the planner's cost curves must not
    keep it (they kept it, and the demo pair never drafted at that size again)."""
    (tcfg, tweights), (dcfg, dweights) = target, draft
    model = PagedModel(build_target(tcfg, tweights, dcfg.target_layer_ids), kv_cache_precision="f32", static_rows=True)
    drafter = BlockDrafter(build_dflash_draft(dcfg, dweights, tweights), kv_cache_precision="f32", static_rows=True)
    calls, propose = [], drafter.propose
    drafter.propose = lambda items: calls.append(len(items)) or propose(items)
    speculation = Speculation(drafter.max_candidates, drafter.candidate_offset)
    speculation.calibration_tried = True  # no timed calls: every observation comes from the scheduler's calls
    scheduler = Scheduler(model, drafter, speculation=speculation)
    scheduler.add_request(tokens(9), GenerationConfig(8, num_assistant_tokens=3))
    scheduler.run()
    observed = {
        name: sum(map(len, cost.recent))
        for name, cost in (("target", speculation.target_cost), ("draft", speculation.draft_cost))
    }
    calls = {"target": scheduler.metrics.steps, "draft": len(calls)}
    compiled = {"target": len(model.static.copies), "draft": len(drafter.model.static.copies)}
    assert all(compiled.values()), compiled
    assert observed == {name: calls[name] - compiled[name] for name in calls}, (observed, calls, compiled)


def test_a_pairs_planner_keeps_and_prices_calls_at_their_copys_rows(target, draft):
    """The planner of a pair with copies keeps a 13-row target call as the 16-row copy's and a 20-row draft call as
    the 24-row copy's (Speculation.for_pair); without copies a call computes the rows it asks for."""
    (tcfg, tweights), (dcfg, dweights) = target, draft
    model = PagedModel(build_target(tcfg, tweights, dcfg.target_layer_ids), kv_cache_precision="f32", static_rows=True)
    drafter = BlockDrafter(build_dflash_draft(dcfg, dweights, tweights), kv_cache_precision="f32", static_rows=True)
    speculation = Speculation.for_pair(model, drafter)
    speculation.target_cost.observe(13, 1.0)
    speculation.draft_cost.observe(20, 1.0)
    assert speculation.target_cost.fastest(16) == speculation.draft_cost.fastest(24) == 1.0
    dynamic = PagedModel(
        build_target(tcfg, tweights, dcfg.target_layer_ids), kv_cache_precision="f32", static_rows=False
    )
    assert dynamic.static is None and Speculation.for_pair(dynamic, drafter).target_cost.computed(13) == 13


def test_compile_copies_compiles_every_row_count_up_front(target):
    cfg, weights = target
    model = PagedModel(build_target(cfg, weights, TAPS), kv_cache_precision="f32", static_rows=True)
    model.compile_copies()
    assert set(model.static.copies) == set(BUCKETS)
    copies = {rows: request for rows, (request, _) in model.static.copies.items()}
    model.run([SequenceRows(0, 0, 5)], {"input_ids": tokens(5), "position_ids": list(range(5)), "logits_indices": [4]})
    assert {rows: request for rows, (request, _) in model.static.copies.items()} == copies, (
        "a call compiled a copy that compile_copies had compiled"
    )
    dynamic = PagedModel(build_target(cfg, weights, TAPS), kv_cache_precision="f32", static_rows=False)
    dynamic.compile_copies()  # nothing to compile
    assert dynamic.static is None and dynamic.compile_s == 0.0


def test_a_copys_first_call_is_a_one_off(target):
    """A copy allocates its memory in its first call: that call's seconds join the one-offs (compile_s) the call
    costs leave out, and later calls of the copy do not. compile_copies makes every copy's first call, on padding rows
    alone, before any request is served, and what the copies compute after it is unchanged."""
    cfg, weights = target
    ir = build_target(cfg, weights, TAPS)
    inputs = {"input_ids": tokens(3), "position_ids": [0, 1, 2], "logits_indices": [2]}
    lazy = PagedModel(ir, kv_cache_precision="f32", static_rows=True)
    cold = lazy.run([SequenceRows(0, 0, 3)], inputs)["logits"].copy()
    first = lazy.compile_s
    assert first > 0 and 3 not in lazy.static.unrun
    lazy.run([SequenceRows(1, 0, 3)], inputs)
    assert lazy.compile_s == first, "a copy's second call was counted as a one-off"

    warmed = PagedModel(ir, kv_cache_precision="f32", static_rows=True)
    warmed.compile_copies()
    assert not warmed.static.unrun, f"copies {sorted(warmed.static.unrun)} were compiled but never called"
    compiled = warmed.compile_s
    logits = warmed.run([SequenceRows(0, 0, 3)], inputs)["logits"]
    assert warmed.compile_s == compiled, "a call after compile_copies was counted as a copy's first"
    np.testing.assert_array_equal(logits, cold)


def test_a_copy_that_does_not_compile_is_one_clear_error(target, monkeypatch):
    """A copy failing to compile mid-run (memory, say) stops with an ovbuild error naming the row count and the way
    out, instead of the plugin's traceback or a silent fall back to the dynamic model (rows would round otherwise)."""
    cfg, weights = target
    model = PagedModel(build_target(cfg, weights, TAPS), kv_cache_precision="f32", static_rows=True)
    model.run([SequenceRows(0, 0, 3)], {"input_ids": tokens(3), "position_ids": [0, 1, 2], "logits_indices": [2]})

    def out_of_memory(*args):
        raise RuntimeError("Exception from src/plugins/intel_cpu/src/graph.cpp:\nstd::bad_alloc")

    monkeypatch.setattr(static_rows, "compiled_copy", out_of_memory)
    try:
        model.run(
            [SequenceRows(0, 3, 5)], {"input_ids": tokens(5), "position_ids": list(range(3, 8)), "logits_indices": [4]}
        )
        error = None
    except Exception as e:  # which exception comes out is what the test checks
        error = e
    assert isinstance(error, UnsupportedError), f"not one ovbuild error: {error!r}"
    assert "for 6 rows does not compile on CPU (std::bad_alloc); --static-rows off" in str(error), str(error)
    again = {"input_ids": tokens(3), "position_ids": [3, 4, 5], "logits_indices": [2]}
    assert model.run([SequenceRows(0, 3, 3)], again)["logits"].shape[0] == 1, "the copy compiled before still runs"


@pytest.mark.parametrize("requested", ["f32", None], ids=["f32", "default"])
def test_rows_compute_bitwise_alike_in_any_call_of_a_dynamic_model(target, requested):
    """A target too big for copies runs in the dynamic-shape model, where the plugin rounds a 1-row call other than
    a call of more rows: its 1-row calls run with a padding row (executors.MIN_ROWS), so the target alone's
    decode rows compute bitwise as its verification rows do, beside a prompt chunk or not."""
    cfg, weights = target
    math = target_inference_precision("CPU", requested, "f16")
    model = PagedModel(build_target(cfg, weights, TAPS), "CPU", "f16", math, static_rows=False)
    context, new = tokens(40), tokens(12)
    alone = rows_in_calls(model, context, new, 1, 0)
    for width, beside in ((2, 0), (5, 0), (12, 0), (1, LONG), (3, 20)):
        got = rows_in_calls(model, context, new, width, beside)
        assert np.array_equal(got, alone), (
            f"{math}: {width} rows per call beside {beside} prompt rows differ from 1-row calls by "
            f"{np.abs(got - alone).max():.3g}"
        )
    assert PAD_SEQUENCE not in model.cache.allocator.tables, "the padding row's block is not the pool's"


def test_a_copy_returns_exactly_the_rows_a_call_names(target):
    """A copy's index input runs padded to a power of two (static_rows.index_size): a call naming 3 of 6 rows, in any
    order, gets those 3 rows back, each as a call naming every row computes it."""
    cfg, weights = target
    model = PagedModel(build_target(cfg, weights, TAPS), kv_cache_precision="f32", static_rows=True)
    ids = tokens(6)
    every = model.run(
        [SequenceRows(0, 0, 6)], {"input_ids": ids, "position_ids": list(range(6)), "logits_indices": list(range(6))}
    )
    every = np.array(every["logits"])
    named = model.run(
        [SequenceRows(1, 0, 6)], {"input_ids": ids, "position_ids": list(range(6)), "logits_indices": [5, 0, 2]}
    )
    assert static_rows.index_size(3, 6) == 4, "the call does not exercise a padded index input"
    assert named["logits"].shape[0] == 3 and named["greedy_ids"].shape[0] == 3
    np.testing.assert_array_equal(named["logits"], every[[5, 0, 2]])

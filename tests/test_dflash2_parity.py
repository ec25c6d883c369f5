"""DFlash v2: the paged draft IR and the Markov head IR against the numpy reference, over packed schedules."""

from __future__ import annotations

import numpy as np
import openvino as ov
import pytest

from ovbuild.families import build_draft_models, load_draft
from ovbuild.graph import dflash
from ovbuild.graph.dflash2 import build_dflash2_draft, build_markov_head
from ovbuild.graph.paged_attention import PagedInputs
from ovbuild.graph.weights import WeightPolicy
from ovbuild.ir import core, read_ir, save_ir
from ovbuild.ir.rt_info import get_rt_info
from ovbuild.reference.dflash2 import DFlash2Reference
from ovbuild.reference.dflash2 import greedy_walk as reference_walk
from ovbuild.runtime.cache.kv_cache import SequenceRows
from ovbuild.runtime.model.padding import DRAFT_PADDING
from ovbuild.runtime.model.paged_model import PagedModel
from ovbuild.runtime.speculation.lattice import greedy_walk
from ovbuild.testing import F32_NMSE, nmse, write_tiny_dflash2, write_tiny_dflash2_short_window
from ovbuild.weights.checkpoint import Checkpoint

from paged_helpers import run_draft

M = 257  # mask token of the tiny checkpoints
# (seq, context rows, block) per call, blocks of up to 8 rows. Call 1: a block opens the pack, two blocks back to back
# (sequence 2 has no context rows); call 2: a one-row block opens the pack, a 3-row block; call 3: context only, a new
# sequence; call 4: sequence 1's context now exceeds the sliding window (10), a 2-row block closes the pack.
SCHEDULE = [
    [(0, 0, [11] + [M] * 7), (1, 13, [12] + [M] * 7), (2, 0, [13] + [M] * 7)],
    [(0, 5, [14]), (1, 3, [15] + [M] * 7), (2, 12, [16, M, M])],
    [(2, 4, []), (0, 9, [17] + [M] * 7), (3, 6, [18] + [M] * 7)],
    [(1, 2, [19] + [M] * 7), (3, 0, [20] + [M] * 7), (0, 1, [21, M])],
]


@pytest.fixture(scope="module", params=["f32", "bf16"])
def v2(request, tmp_path_factory, target):
    """Per checkpoint dtype: config, weights, reference, and the schedule's outputs from the compiled draft IR."""
    folder = write_tiny_dflash2(tmp_path_factory.mktemp("dflash2") / request.param, dtype=request.param)
    cfg, weights = load_draft(Checkpoint.open(folder))
    ref = DFlash2Reference(cfg, weights, target[1])
    model = PagedModel(build_dflash2_draft(cfg, weights, target[1]), kv_cache_precision="f32")
    return request.param, cfg, weights, ref, run_draft(model, ref, SCHEDULE)


# Blocks of up to 7 rows for the short-window variant (window 4 or 1 in its sliding layer): blocks with and without
# context rows in the pack, a block shorter than the window, a context-only sequence, and a chunk (sequence 0, call 4)
# that crosses the 32-row cache block.
SHORT_WINDOW_SCHEDULE = [
    [(0, 0, [11] + [M] * 6), (1, 13, [12] + [M] * 6), (2, 0, [13] + [M] * 6)],
    [(0, 5, [14] + [M] * 6), (1, 3, [15] + [M] * 6), (2, 12, [16, M, M])],
    [(2, 4, []), (0, 9, [17] + [M] * 6), (3, 6, [18] + [M] * 6)],
    [(1, 2, [19] + [M] * 6), (3, 0, [20] + [M] * 6), (0, 20, [21] + [M] * 6)],
]


def short_window_run(tmp_path, target, window: int):
    """The short-window draft's IR and reference over SHORT_WINDOW_SCHEDULE."""
    cfg, weights = load_draft(Checkpoint.open(write_tiny_dflash2_short_window(tmp_path / "d", window=window)))
    assert cfg.block_size == 7 and cfg.sliding_windows == (window, 0) and cfg.layer_causal == (False, False)
    model = PagedModel(build_dflash2_draft(cfg, weights, target[1]), kv_cache_precision="f32")
    return run_draft(model, DFlash2Reference(cfg, weights, target[1]), SHORT_WINDOW_SCHEDULE)


@pytest.mark.parametrize("window", [4, 1])
def test_window_below_the_block_matches_reference(tmp_path, target, window):
    """Block rows `window` or more apart do not see each other in the sliding layer (window 1: each row only itself)."""
    out = short_window_run(tmp_path, target, window)
    logits, hidden = out.nmse("logits"), out.nmse("last_hidden_state")
    calls = len(SHORT_WINDOW_SCHEDULE)
    print(f"window {window} < block 7, {calls} packed calls: logits NMSE {logits:.2e}, hidden {hidden:.2e}")
    assert logits < 1e-6, f"window {window} logits NMSE {logits:.2e}"
    assert hidden < 1e-6, f"window {window} last_hidden_state NMSE {hidden:.2e}"


def test_window_below_the_block_needs_the_band(tmp_path, target, monkeypatch):
    """PagedAttention's own window leaves the whole block visible: without the band the IR is far from the reference."""
    monkeypatch.setattr(dflash, "PagedInputs", lambda **_: PagedInputs())
    out = short_window_run(tmp_path, target, 4)
    print(f"window 4 < block 7 without the band: logits NMSE {out.nmse('logits'):.2e}")
    assert out.nmse("logits") > 1e-2, f"the band made no difference: NMSE {out.nmse('logits'):.2e}"


def compiled_head(cfg, weights, policy=None) -> ov.CompiledModel:
    return core().compile_model(build_markov_head(cfg, weights, policy), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})


def test_v2_draft_matches_reference(v2):
    dtype, _, _, _, out = v2
    logits, hidden = out.nmse("logits"), out.nmse("last_hidden_state")
    print(f"{dtype} v2 draft over {len(SCHEDULE)} packed calls: logits NMSE {logits:.2e}, hidden NMSE {hidden:.2e}")
    assert logits < F32_NMSE, f"{dtype} logits NMSE {logits:.2e}"
    assert hidden < F32_NMSE, f"{dtype} last_hidden_state NMSE {hidden:.2e}"


@pytest.mark.parametrize("static", [False, True], ids=["padded", "static"])
def test_padded_v2_draft_matches_reference(v2, target, static):
    """With its calls padded as the drafter runs them (a padding sequence after the real ones, in the dynamic model
    or in a static copy per row count): the grouped conv and the block masks see each sequence alone, so the real
    rows' outputs stay the reference's."""
    dtype, cfg, weights, ref, _ = v2
    model = PagedModel(
        build_dflash2_draft(cfg, weights, target[1]),
        kv_cache_precision="f32",
        padding=DRAFT_PADDING,
        static_rows=static,
    )
    out = run_draft(model, ref, SCHEDULE)
    print(f"{dtype} v2 draft, padded calls ({'static' if static else 'dynamic'}): logits NMSE {out.nmse('logits'):.2e}")
    assert out.nmse("logits") < F32_NMSE and out.nmse("last_hidden_state") < F32_NMSE


def test_conv_taps_move_the_draft_outputs(v2, target):
    """The tiny checkpoint's taps really reach earlier rows: dropping taps >= 1 changes the reference's logits."""
    _, cfg, weights, ref, _ = v2
    taps = np.random.default_rng(5).standard_normal((6, cfg.num_taps * cfg.target_hidden_size))
    block = np.array([11] + [M] * 7)
    full, _ = ref.forward(ref.new_cache(), taps, block)
    no_taps = DFlash2Reference(cfg, weights, target[1])
    for layer in no_taps.convs:
        for conv in layer.values():
            conv.base_kernel[:, 1:] = 0
            conv.kernel_projection.reshape(2, cfg.conv_kernel_size, -1)[:, 1:] = 0
    cut, _ = no_taps.forward(no_taps.new_cache(), taps, block)
    print(f"reference logits without taps >= 1 vs with them: NMSE {nmse(cut, full):.2e}")
    assert nmse(cut, full) > 1e-2, f"taps >= 1 barely matter: NMSE {nmse(cut, full):.2e}"


def head_inputs(call: dict, schedule_call) -> dict[str, np.ndarray]:
    """Pack one call's candidate rows (from the draft IR) as the Markov head takes them."""
    seqs = [s for s, _, _ in schedule_call]
    counts = [len(call[s]["logits"]) for s in seqs]
    return {
        "logits": np.concatenate([call[s]["logits"] for s in seqs]),
        "draft_hidden_states": np.concatenate([call[s]["last_hidden_state"] for s in seqs]),
        "prev_token_ids": np.array([b[0] if b else 0 for _, _, b in schedule_call], np.int64),
        "candidate_begins": np.cumsum([0, *counts]).astype(np.int32),
    }


def test_markov_head_matches_reference_lattice(v2):
    """The head's lattice on the draft IR's own outputs, against the selector formula on the same inputs."""
    dtype, cfg, weights, ref, out = v2
    head = compiled_head(cfg, weights)
    ir_edges, ref_edges, rows = [], [], 0
    for call, schedule_call in zip(out.ir, SCHEDULE, strict=True):
        inputs = head_inputs(call, schedule_call)
        got = head(inputs)
        ids, edges = got["candidate_ids"], got["edge_scores"]
        begins = inputs["candidate_begins"]
        assert ids.dtype == np.int64 and ids.shape == (begins[-1], cfg.selector_top_k)
        assert edges.shape == (begins[-1], cfg.selector_top_k, cfg.selector_top_k)
        for i, (seq, _, block) in enumerate(schedule_call):
            b, e = begins[i], begins[i + 1]
            cand, ref_e = ref.lattice(call[seq]["logits"], call[seq]["last_hidden_state"], block[0] if block else 0)
            np.testing.assert_array_equal(ids[b:e], cand, err_msg=f"{dtype} call sequence {seq}: candidate ids")
            ir_edges.append(edges[b:e].ravel())
            ref_edges.append(ref_e.ravel())
            rows += e - b
    err = nmse(np.concatenate(ir_edges), np.concatenate(ref_edges))
    print(f"{dtype} Markov head over {rows} candidate rows: edge_scores NMSE {err:.2e}")
    assert err < F32_NMSE, f"{dtype} edge_scores NMSE {err:.2e}"


def test_proposals_match_reference_end_to_end(v2):
    """Draft IR -> head IR -> runtime walk proposes what the reference draft, selector and walk propose."""
    dtype, cfg, weights, ref, out = v2
    head = compiled_head(cfg, weights)
    proposed = 0
    for ir_call, ref_call, schedule_call in zip(out.ir, out.ref, SCHEDULE, strict=True):
        inputs = head_inputs(ir_call, schedule_call)
        got = head(inputs)
        walks = greedy_walk(got["candidate_ids"], got["edge_scores"], inputs["candidate_begins"])
        for (seq, _, block), tokens in zip(schedule_call, walks, strict=True):
            r = ref_call[seq]
            expected = reference_walk(*ref.lattice(r["logits"], r["last_hidden_state"], block[0] if block else 0))
            np.testing.assert_array_equal(tokens, expected, err_msg=f"{dtype} sequence {seq}")
            proposed += len(tokens)
    assert proposed == sum(max(len(b) - 1, 0) for call in SCHEDULE for _, _, b in call)


def test_selector_changes_proposals_against_plain_argmax(v2):
    """The transitions matter on this checkpoint: some walked tokens differ from the unary argmax."""
    ref, out = v2[3], v2[4]
    differ = total = 0
    for ref_call, schedule_call in zip(out.ref, SCHEDULE, strict=True):
        for seq, _, block in schedule_call:
            r = ref_call[seq]
            walked = reference_walk(*ref.lattice(r["logits"], r["last_hidden_state"], block[0] if block else 0))
            differ += int(np.sum(walked != r["logits"].argmax(-1)))
            total += len(walked)
    assert 0 < differ < total, f"{differ} of {total} walked tokens differ from the argmax"


ISOLATION_CALL = [(0, 0, [11] + [M] * 7), (1, 6, [12] + [M] * 7), (2, 0, [13, M, M]), (3, 5, [14] + [M] * 7)]


def run_call(model: PagedModel, cfg, call, taps, ids, positions) -> dict[int, dict[str, np.ndarray]]:
    """One first call (every past_lens 0, so reruns are independent) with explicit inputs; outputs per sequence."""
    rows, tt, cand, start = [], [], [], 0
    for seq, n_ctx, block in call:
        n = n_ctx + len(block)
        rows.append(SequenceRows(seq, 0, n))
        tt += [0] * n_ctx + [1] * len(block)
        cand += range(start + n_ctx + cfg.candidate_offset, start + n)
        start += n
    result = model.run(
        rows,
        {
            "input_ids": ids,
            "position_ids": positions,
            "token_type_ids": np.array(tt, np.int32),
            "hidden_states": taps,
            "candidate_indices": np.array(cand, np.int64),
        },
    )
    per_seq, begin = {}, 0
    for seq, _, block in call:
        end = begin + max(len(block) - cfg.candidate_offset, 0)
        per_seq[seq] = {k: v[begin:end].copy() for k, v in result.items()}
        begin = end
    return per_seq


def test_sequences_are_isolated(target, tmp_path):
    """Each input is read only in its own sequence's rows; context rows' token ids are read nowhere."""
    cfg, weights = load_draft(Checkpoint.open(write_tiny_dflash2(tmp_path / "d")))
    model = PagedModel(build_dflash2_draft(cfg, weights, target[1]), kv_cache_precision="f32")
    rng = np.random.default_rng(3)
    starts = np.cumsum([0] + [c + len(b) for _, c, b in ISOLATION_CALL])
    n = starts[-1]
    taps = rng.standard_normal((n, cfg.num_taps * cfg.target_hidden_size)).astype(np.float32)
    ids = np.concatenate([[M] * c + b for _, c, b in ISOLATION_CALL]).astype(np.int64)
    positions = np.concatenate([np.arange(c + len(b)) for _, c, b in ISOLATION_CALL]).astype(np.int64)
    base = run_call(model, cfg, ISOLATION_CALL, taps, ids, positions)

    def changed_sequences(taps=taps, ids=ids, positions=positions) -> set[int]:
        out = run_call(model, cfg, ISOLATION_CALL, taps, ids, positions)
        return {s for s in out if not all(np.array_equal(out[s][k], base[s][k]) for k in out[s])}

    for i, (seq, n_ctx, _) in enumerate(ISOLATION_CALL):
        rows = slice(starts[i], starts[i + 1])
        new_ids = ids.copy()
        new_ids[starts[i] + n_ctx] = 99  # the anchor
        assert changed_sequences(ids=new_ids) == {seq}, f"anchor of sequence {seq}"
        new_positions = positions.copy()
        new_positions[rows] += 5
        assert changed_sequences(positions=new_positions) == {seq}, f"positions of sequence {seq}"
        if n_ctx:
            new_taps = taps.copy()
            new_taps[rows] += 1.0
            assert changed_sequences(taps=new_taps) == {seq}, f"context taps of sequence {seq}"
    context_rows = np.concatenate([np.arange(s, s + c) for s, (_, c, _) in zip(starts, ISOLATION_CALL, strict=False)])
    new_ids = ids.copy()
    new_ids[context_rows] = 42
    assert changed_sequences(ids=new_ids) == set(), "a context row's token id reached a block row"


def test_rt_info_and_registry(tmp_path, target):
    cfg, weights = load_draft(Checkpoint.open(write_tiny_dflash2(tmp_path / "d")))
    models = build_draft_models(cfg, weights, target[1])
    assert set(models) == {"openvino_model", "openvino_markov_head_model"}
    backbone, head = models["openvino_model"], models["openvino_markov_head_model"]
    expected = {
        "dflash/version": "2",
        "dflash/gpu_min_activations_scale_factor": "32",
        "dflash/top_k": "6",
        "dflash/selector_rank": "16",
        "dflash/conv_kernel_size": "3",
        "dflash/output_multiplier": "1.7",
        "dflash/final_logit_softcapping": "2.5",
        "dflash/input_embedding_scale": "0.6",
        "dflash/mask_token_id": "257",
        "ovbuild/family": "dflash2",
    }
    assert {k: get_rt_info(backbone, k) for k in expected} == expected
    head_expected = {"markov_head_type": "dflash2", "markov_rank": "16", "dflash/top_k": "6", "pa/num_kv_heads": None}
    assert {k: get_rt_info(head, k) for k in head_expected} == head_expected
    assert [p.get_any_name() for p in head.inputs] == [
        "logits",
        "draft_hidden_states",
        "prev_token_ids",
        "candidate_begins",
    ]
    assert [p.get_any_name() for p in head.outputs] == ["candidate_ids", "edge_scores"]
    path = save_ir(head, tmp_path / "ir" / "openvino_markov_head_model.xml")
    read = read_ir(path)
    assert get_rt_info(read, "markov_head_type") == "dflash2"


def codebook_types(head: ov.Model) -> set[str]:
    """Element types of the constants behind the codebook Gathers."""
    return {
        n.get_element_type().get_type_name()
        for n in head.get_ops()
        if n.get_type_name() == "Constant" and "codebook" in n.get_friendly_name()
    }


def test_head_keeps_checkpoint_precision_unless_asked(tmp_path):
    cfg, weights = load_draft(Checkpoint.open(write_tiny_dflash2(tmp_path / "d", dtype="bf16")))
    assert codebook_types(build_markov_head(cfg, weights)) == {"bf16"}
    assert codebook_types(build_markov_head(cfg, weights, WeightPolicy("fp32"))) == {"f32"}
    assert codebook_types(build_markov_head(cfg, weights, WeightPolicy("fp16"))) == {"f16"}


def test_gpu_compile_config_raises_the_activations_scale_factor(v2, target):
    """Compiled on GPU, the v2 backbone gets at least the scale factor its rt_info asks for (no GPU needed here)."""
    from ovbuild.runtime.model.paged_model import compile_config

    _, cfg, weights, _, _ = v2
    model = build_dflash2_draft(cfg, weights, target[1])
    assert compile_config("f16", None, "GPU.0", model)["ACTIVATIONS_SCALE_FACTOR"] == "32.0"
    model.set_rt_info("64", ["runtime_options", "ACTIVATIONS_SCALE_FACTOR"])
    assert compile_config("f16", None, "GPU", model)["ACTIVATIONS_SCALE_FACTOR"] == "64.0"
    assert "ACTIVATIONS_SCALE_FACTOR" not in compile_config("f16", None, "CPU", model)

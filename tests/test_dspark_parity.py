"""DSpark / DeepSpec DFlash IRs against the numpy reference: backbone with candidate offset 0, the exact greedy chain
of the Markov head (vanilla, gated; f32 and bf16 checkpoints), the confidence heads, IR layout and precision."""

from __future__ import annotations

import numpy as np
import openvino as ov
import pytest

from ovbuild.families import build_draft_models
from ovbuild.graph.dspark import MARKOV_HEAD, build_dspark_draft, build_markov_head
from ovbuild.graph.weights import WeightPolicy
from ovbuild.ir import core
from ovbuild.ir.rt_info import get_rt_info
from ovbuild.reference.dspark import DSparkReference, sigmoid
from ovbuild.runtime.model.padding import DRAFT_PADDING
from ovbuild.runtime.model.paged_model import PagedModel
from ovbuild.testing import F32_NMSE
from ovbuild.testing.references import REFERENCES as DRAFT_REFERENCES

from dspark_helpers import SCHEDULE, load_kind, pack_blocks, run_head
from paged_helpers import run_draft

F32 = {"INFERENCE_PRECISION_HINT": "f32"}


@pytest.fixture(scope="module")
def drafts(tmp_path_factory):
    """Tiny drafts by (kind, dtype), each with embed_tokens and lm_head of its own (not the target's)."""
    root = tmp_path_factory.mktemp("dspark")
    kinds = [("vanilla", "f32"), ("gated", "f32"), ("vanilla", "bf16"), ("gated", "bf16"), ("deepspec_dflash", "f32")]
    return {(k, d): load_kind(root, k, d) for k, d in kinds}


@pytest.fixture(scope="module")
def backbone_runs(drafts, target):
    """The backbone IR and the reference over SCHEDULE, per draft, run once."""
    runs = {}
    for key, (cfg, weights) in drafts.items():
        model = PagedModel(build_dspark_draft(cfg, weights, target[1]), kv_cache_precision="f32")
        ref = DSparkReference(cfg, weights, target[1])
        runs[key] = (ref, run_draft(model, ref, SCHEDULE))
    return runs


def anchors_of(call) -> dict[int, int]:
    return {seq: blk[0] for seq, _, blk in call if blk}


@pytest.mark.parametrize("kind", ["vanilla", "deepspec_dflash"])
def test_backbone_matches_reference_with_its_own_tables(kind, drafts, backbone_runs, target):
    _, weights = drafts[(kind, "f32")]
    assert not np.allclose(weights.get("lm_head").to_f32(), target[1].get("lm_head").to_f32())
    _, out = backbone_runs[(kind, "f32")]
    rows = sum(len(c[s]["logits"]) for c in out.ir for s in c)
    assert rows == 7 * 10 + 2, "offset 0: every block row is a candidate row"
    for name in ("logits", "last_hidden_state"):
        assert out.nmse(name) < F32_NMSE, f"{kind} {name} NMSE {out.nmse(name):.2e}"
    print(f"{kind} backbone: logits NMSE {out.nmse('logits'):.2e}, hidden NMSE {out.nmse('last_hidden_state'):.2e}")


@pytest.mark.parametrize("static", [False, True], ids=["padded", "static"])
def test_padded_backbone_matches_reference(drafts, target, static):
    """With its calls padded as the drafter runs them (in the dynamic model or in a static copy per row count), the
    real rows' outputs stay the reference's."""
    cfg, weights = drafts[("gated", "f32")]
    model = PagedModel(
        build_dspark_draft(cfg, weights, target[1]), kv_cache_precision="f32", padding=DRAFT_PADDING, static_rows=static
    )
    out = run_draft(model, DSparkReference(cfg, weights, target[1]), SCHEDULE)
    print(f"gated backbone, padded calls: logits NMSE {out.nmse('logits'):.2e}")
    assert out.nmse("logits") < F32_NMSE and out.nmse("last_hidden_state") < F32_NMSE


def test_backbone_sequences_are_isolated(drafts, target):
    cfg, weights = drafts[("gated", "f32")]
    ref = DSparkReference(cfg, weights, target[1])
    base = run_draft(PagedModel(build_dspark_draft(cfg, weights, target[1]), kv_cache_precision="f32"), ref, SCHEDULE)
    changed_schedule = [[(s, n, [99, *b[1:]] if s == 0 and b else b) for s, n, b in call] for call in SCHEDULE]
    changed = run_draft(
        PagedModel(build_dspark_draft(cfg, weights, target[1]), kv_cache_precision="f32"), ref, changed_schedule
    )
    for a, b in zip(base.ir, changed.ir, strict=True):
        for seq in a:
            same = all(np.array_equal(a[seq][k], b[seq][k]) for k in a[seq])
            assert same == (seq != 0 or not len(a[seq]["logits"])), f"sequence {seq} {'un' if same else ''}changed"


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("kind", ["vanilla", "gated"])
def test_chain_equals_the_sequential_head_on_every_row(kind, dtype, drafts, backbone_runs):
    """Fed the same candidate rows, the chain IR proposes what the authors' loop proposes, row for row."""
    cfg, weights = drafts[(kind, dtype)]
    ref, out = backbone_runs[(kind, dtype)]
    head = core().compile_model(build_markov_head(cfg, weights), "CPU", F32)
    rows = changed = 0
    worst_confidence = 0.0
    for call, ref_call in zip(SCHEDULE, out.ref, strict=True):
        inputs = pack_blocks(ref_call, anchors_of(call))
        got = run_head(head, inputs)
        begins = inputs["candidate_begins"]
        for i in range(len(begins) - 1):
            b, e = begins[i], begins[i + 1]
            logits, hidden = inputs["logits"][b:e].astype(np.float64), inputs["draft_hidden_states"][b:e]
            tokens, confidence = ref.sequential_head(
                logits, hidden.astype(np.float64), int(inputs["prev_token_ids"][i])
            )
            assert np.array_equal(got["chain_ids"][b:e], tokens), f"call rows {b}:{e}"
            worst_confidence = max(worst_confidence, float(np.abs(got["confidence"][b:e] - confidence).max(initial=0)))
            rows += e - b
            changed += int((tokens != logits.argmax(-1)).sum())
    assert worst_confidence < 1e-6, f"confidence max abs error {worst_confidence:.2e}"
    assert changed > 0, "the Markov bias never changed a choice: the test would not see a broken chain"
    print(f"{kind} {dtype}: chain == sequential head on {rows} rows; the bias changed {changed / rows:.0%} of argmaxes")


@pytest.mark.parametrize("kind", ["vanilla", "gated"])
def test_chain_on_ir_logits_equals_the_reference_end_to_end(kind, drafts, backbone_runs):
    """Backbone IR then head IR against reference backbone then sequential head, over every step of SCHEDULE."""
    cfg, weights = drafts[(kind, "f32")]
    ref, out = backbone_runs[(kind, "f32")]
    head = core().compile_model(build_markov_head(cfg, weights), "CPU", F32)
    for call, ir_call, ref_call in zip(SCHEDULE, out.ir, out.ref, strict=True):
        anchors = anchors_of(call)
        got = run_head(head, pack_blocks(ir_call, anchors))
        expected = [
            ref.sequential_head(ref_call[s]["logits"], ref_call[s]["last_hidden_state"], anchors.get(s, 0))[0]
            for s in sorted(ref_call)
        ]
        assert np.array_equal(got["chain_ids"], np.concatenate(expected))


def test_chain_sequences_are_isolated(drafts, backbone_runs):
    cfg, weights = drafts[("gated", "f32")]
    _, out = backbone_runs[("gated", "f32")]
    head = core().compile_model(build_markov_head(cfg, weights), "CPU", F32)
    inputs = pack_blocks(out.ref[0], anchors_of(SCHEDULE[0]))
    base = run_head(head, inputs)
    begins = inputs["candidate_begins"]
    changed_inputs = {k: v.copy() for k, v in inputs.items()}
    changed_inputs["prev_token_ids"][1] = 99
    changed_inputs["logits"][begins[1] + 3, 7] = 100.0  # row 3 of sequence 1 now surely picks token 7
    changed = run_head(head, changed_inputs)
    for name in ("chain_ids", "confidence"):
        for i in range(len(begins) - 1):
            rows = slice(begins[i], begins[i + 1])
            same = np.array_equal(base[name][rows], changed[name][rows])
            assert same == (i != 1), f"{name} of sequence {i} {'un' if same else ''}changed"


def test_hidden_state_confidence_is_a_backbone_output(tmp_path, target):
    """A confidence head without Markov features reads only h: it is a backbone output, and no head file exists."""
    cfg, weights = load_kind(
        tmp_path, "deepspec_dflash", enable_confidence_head=True, confidence_head_with_markov=False
    )
    models = build_draft_models(cfg, weights, target[1])
    assert list(models) == ["openvino_model"]
    ref = DSparkReference(cfg, weights, target[1])
    out = run_draft(PagedModel(models["openvino_model"], kv_cache_precision="f32"), ref, SCHEDULE)
    got = np.concatenate([c[s]["confidence"] for c in out.ir for s in sorted(c)])
    hidden = np.concatenate([c[s]["last_hidden_state"] for c in out.ref for s in sorted(c)])
    expected = [ref.confidence(h, 0) for h in hidden]
    assert np.abs(got - expected).max() < 1e-6, f"confidence max abs error {np.abs(got - expected).max():.2e}"


def test_draft_folder_layout_and_rt_info(drafts, target):
    cfg, weights = drafts[("gated", "f32")]
    models = build_draft_models(cfg, weights, target[1])
    assert sorted(models) == [MARKOV_HEAD, "openvino_model"]
    backbone, head = models["openvino_model"], models[MARKOV_HEAD]
    assert get_rt_info(backbone, "dflash/candidate_offset") == "0"
    assert get_rt_info(backbone, "ovbuild/markov_head") == MARKOV_HEAD
    assert [p.get_any_name() for p in head.inputs] == [
        "logits",
        "prev_token_ids",
        "candidate_begins",
        "draft_hidden_states",
    ]
    assert [p.get_any_name() for p in head.outputs] == [
        "chain_ids",
        "confidence",
        "candidate_ids",
        "edge_scores",
        "predecessor_confidence",
    ]
    info = {k: get_rt_info(head, k) for k in ("markov_head_type", "markov_rank", "markov_head_mode", "ovbuild/kind")}
    assert info == {
        "markov_head_type": "gated",
        "markov_rank": "16",
        "markov_head_mode": "chain,lattice",
        "ovbuild/kind": "markov_head",
    }
    assert get_rt_info(head, "pa/num_kv_heads") is None
    vanilla_cfg, vanilla_weights = drafts[("vanilla", "f32")]
    vanilla = build_markov_head(vanilla_cfg, vanilla_weights)
    assert "draft_hidden_states" in {p.get_any_name() for p in vanilla.inputs}  # the Markov confidence head reads h
    rank0 = build_draft_models(*drafts[("deepspec_dflash", "f32")], target[1])
    assert list(rank0) == ["openvino_model"] and get_rt_info(rank0["openvino_model"], "markov_rank") == "0"
    assert set(DRAFT_REFERENCES) >= {"dflash", "dspark"}


@pytest.mark.parametrize(
    "dtype, weight_format, expected",
    [("bf16", "keep", ov.Type.bf16), ("f32", "keep", ov.Type.f32), ("bf16", "fp16", ov.Type.f16)],
)
def test_head_keeps_checkpoint_precision_unless_asked(dtype, weight_format, expected, drafts, tmp_path):
    cfg, weights = drafts[("gated", dtype)]
    head = build_markov_head(cfg, weights, WeightPolicy(weight_format))
    constants = {op.get_friendly_name(): op for op in head.get_ops() if op.get_type_name() == "Constant"}
    for name in ("markov_head/markov_w1", "markov_head/markov_w2", "markov_head/gate_proj"):
        node = constants.get(f"{name}/weight/stored") or constants[f"{name}/weight"]
        assert node.get_output_element_type(0) == expected, name


def test_reference_confidence_formula_by_hand(drafts, target):
    """c = sigmoid(w . [h ; W1[x]] + b), spelled out from the checkpoint tensors."""
    cfg, weights = drafts[("vanilla", "f32")]
    ref = DSparkReference(cfg, weights, target[1])
    h = np.linspace(-1, 1, cfg.hidden_size)
    w = weights.get("confidence_head.proj").to_f32()[0].astype(np.float64)
    b = float(weights.get("confidence_head.proj.bias").to_f32()[0])
    w1 = weights.get("markov_head.markov_w1").to_f32().astype(np.float64)
    expected = sigmoid(w[: cfg.hidden_size] @ h + w[cfg.hidden_size :] @ w1[42] + b)
    assert np.isclose(ref.confidence(h, 42), expected)

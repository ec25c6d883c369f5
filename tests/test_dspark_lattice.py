"""The DSpark Markov head as a packed Top-K lattice (vanilla, gated) against the reference formula, its dense first
step against the sequential head, the lattice drafter mode, and (reported, not asserted) how often the lattice walk
agrees with the exact head and what both modes accept."""

from __future__ import annotations

import numpy as np
import pytest

from ovbuild.errors import ConfigError
from ovbuild.graph.dspark import build_dspark_draft, build_lattice_markov_head
from ovbuild.graph.target import build_target
from ovbuild.ir import core
from ovbuild.ir.rt_info import get_rt_info
from ovbuild.reference.dflash2 import greedy_walk
from ovbuild.reference.dspark import DSparkReference, confident_prefix
from ovbuild.runtime.model.paged_model import PagedModel
from ovbuild.runtime.request import GenerationConfig
from ovbuild.runtime.scheduler import Scheduler
from ovbuild.runtime.speculation.drafters import DraftItem, DSparkDrafter
from ovbuild.testing import F32_NMSE, nmse
from ovbuild.testing.planner import fixed_speculation

from dspark_helpers import SCHEDULE, load_kind, pack_blocks, run_head
from paged_helpers import run_draft

F32 = dict(kv_cache_precision="f32")
TOP_K = 8


@pytest.fixture(scope="module")
def drafts(tmp_path_factory, tiny_target):
    root = tmp_path_factory.mktemp("dspark_lattice")
    kinds = [("vanilla", "f32"), ("gated", "f32"), ("vanilla", "bf16"), ("gated", "bf16")]
    return {(k, d): load_kind(root, k, d, tables_from=tiny_target) for k, d in kinds}


@pytest.fixture(scope="module")
def packed_blocks(drafts, target):
    """Per draft: the reference, and the head inputs of every call of SCHEDULE from the reference backbone."""
    out = {}
    for key, (cfg, weights) in drafts.items():
        ref = DSparkReference(cfg, weights, target[1])
        run = run_draft(PagedModel(build_dspark_draft(cfg, weights, target[1]), **F32), ref, SCHEDULE)
        anchors = [{s: b[0] for s, _, b in call if b} for call in SCHEDULE]
        out[key] = (ref, [pack_blocks(c, a) for c, a in zip(run.ref, anchors, strict=True)])
    return out


def sequences(inputs: dict[str, np.ndarray]):
    """(index, rows slice, f64 logits, f64 hidden, anchor) of every sequence with candidate rows."""
    begins = inputs["candidate_begins"]
    for i in range(len(begins) - 1):
        rows = slice(begins[i], begins[i + 1])
        if begins[i + 1] > begins[i]:
            logits, hidden = inputs["logits"][rows], inputs["draft_hidden_states"][rows]
            yield i, rows, logits.astype(np.float64), hidden.astype(np.float64), int(inputs["prev_token_ids"][i])


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("kind", ["vanilla", "gated"])
def test_lattice_matches_the_reference_formula(kind, dtype, drafts, packed_blocks):
    cfg, weights = drafts[(kind, dtype)]
    ref, calls = packed_blocks[(kind, dtype)]
    head = core().compile_model(
        build_lattice_markov_head(cfg, weights, top_k=TOP_K), "CPU", {"INFERENCE_PRECISION_HINT": "f32"}
    )
    got_edges, want_edges, worst_confidence = [], [], 0.0
    for inputs in calls:
        got = run_head(head, inputs)
        for _, rows, logits, hidden, anchor in sequences(inputs):
            candidates, edges, predecessors = ref.lattice(logits, hidden, anchor, TOP_K)
            assert np.array_equal(got["candidate_ids"][rows], candidates)
            got_edges.append(got["edge_scores"][rows].ravel())
            want_edges.append(edges.ravel())
            confidence = ref.predecessor_confidence(hidden, predecessors)
            worst_confidence = max(
                worst_confidence, float(np.abs(got["predecessor_confidence"][rows] - confidence).max())
            )
            assert np.array_equal(got["chain_ids"][rows], ref.sequential_head(logits, hidden, anchor)[0])
    error = nmse(np.concatenate(got_edges), np.concatenate(want_edges))
    assert error < F32_NMSE, f"edge_scores NMSE {error:.2e}"
    assert worst_confidence < 1e-6, f"predecessor_confidence max abs error {worst_confidence:.2e} (measured 1.7e-7)"
    print(f"{kind} {dtype} lattice: edge_scores NMSE {error:.2e}, confidence max abs error {worst_confidence:.1e}")


@pytest.mark.parametrize("kind", ["vanilla", "gated"])
def test_dense_first_step_equals_the_sequential_head_on_row_one(kind, drafts, packed_blocks):
    cfg, weights = drafts[(kind, "f32")]
    ref, calls = packed_blocks[(kind, "f32")]
    head = core().compile_model(
        build_lattice_markov_head(cfg, weights, top_k=TOP_K), "CPU", {"INFERENCE_PRECISION_HINT": "f32"}
    )
    outside = 0
    for inputs in calls:
        got = run_head(head, inputs)
        for _, rows, logits, hidden, anchor in sequences(inputs):
            first = rows.start
            exact = ref.sequential_head(logits, hidden, anchor)[0][0]
            edges = got["edge_scores"][first]
            assert got["candidate_ids"][first, int(np.argmax(edges[0]))] == exact
            assert np.array_equal(edges, np.broadcast_to(edges[0], edges.shape)), "one predecessor: the anchor"
            outside += exact not in np.argsort(-logits[0])[:TOP_K]
    print(f"{kind}: dense first step == sequential row one; {outside} first tokens lay outside the unary top {TOP_K}")


def test_lattice_head_rt_info_and_forms(drafts):
    cfg, weights = drafts[("gated", "f32")]
    both = build_lattice_markov_head(cfg, weights, top_k=5)
    assert get_rt_info(both, "markov_head_mode") == "chain,lattice" and get_rt_info(both, "dflash/top_k") == "5"
    assert [p.get_any_name() for p in both.outputs] == [
        "chain_ids",
        "confidence",
        "candidate_ids",
        "edge_scores",
        "predecessor_confidence",
    ]
    lattice_only = build_lattice_markov_head(cfg, weights, with_chain=False)
    assert get_rt_info(lattice_only, "markov_head_mode") == "lattice"
    assert {p.get_any_name() for p in lattice_only.outputs} == {
        "candidate_ids",
        "edge_scores",
        "predecessor_confidence",
    }
    with pytest.raises(ConfigError, match=r"lattice top_k = 0 must lie in \[1, vocab_size = 320\]"):
        build_lattice_markov_head(cfg, weights, top_k=0)


@pytest.fixture(scope="module")
def models(drafts, target):
    """Target IR and, per kind, backbone + chain-and-lattice head (f32 checkpoints)."""
    built = {"target": build_target(*target, drafts[("vanilla", "f32")][0].target_layer_ids)}
    for kind in ("vanilla", "gated"):
        cfg, weights = drafts[(kind, "f32")]
        built[kind] = (
            build_dspark_draft(cfg, weights, target[1]),
            build_lattice_markov_head(cfg, weights, top_k=TOP_K),
        )
    return built


@pytest.mark.parametrize("kind", ["vanilla", "gated"])
def test_lattice_mode_proposes_the_reference_walk(kind, drafts, models, target):
    """The drafter's lattice mode: the reference walk, cut where the walked path's confidence drops below 0.5."""
    cfg, weights = drafts[(kind, "f32")]
    drafter = DSparkDrafter(*models[kind], markov_mode="lattice", confidence_threshold=0.5, **F32)
    ref = DSparkReference(cfg, weights, target[1])
    rng = np.random.default_rng(3)
    caches = {}
    for _ in range(3):
        items = [
            DraftItem(s, rng.standard_normal((4, 3 * 64)).astype(np.float32), int(rng.integers(0, 256)), 7)
            for s in range(3)
        ]
        for item, proposal in zip(items, drafter.propose(items), strict=True):
            logits, hidden = ref.step(
                caches.setdefault(item.seq_id, ref.new_cache()), item.context.astype(np.float64), item.anchor
            )
            candidates, edges, _ = ref.lattice(logits, hidden, item.anchor, TOP_K)
            tokens = greedy_walk(candidates, edges)
            confidence = [ref.confidence(h, p) for h, p in zip(hidden, [item.anchor, *tokens[:-1]], strict=True)]
            assert proposal == tokens[: confident_prefix(np.array(confidence), 0.5)].tolist()


def agreement(drafters: dict[str, DSparkDrafter], steps: int, seed: int) -> dict[str, float]:
    """Both modes on identical draft calls: row-wise agreement, whole blocks equal, mean common prefix.

    Row one must always agree: the lattice's dense first step is the exact head's first step.
    """
    rng = np.random.default_rng(seed)
    rows = same_rows = same_blocks = blocks = prefix = 0
    for _ in range(steps):
        items = [
            DraftItem(
                s,
                rng.standard_normal((int(rng.integers(1, 6)), 3 * 64)).astype(np.float32),
                int(rng.integers(0, 256)),
                7,
            )
            for s in range(4)
        ]
        chain, lattice = (drafters[m].propose(items) for m in ("chain", "lattice"))
        for c, w in zip(chain, lattice, strict=True):
            assert len(c) == len(w) == 7 and c[0] == w[0], f"row one differs: chain {c}, lattice {w}"
            equal = np.array(c) == np.array(w)
            rows, same_rows, blocks = rows + len(c), same_rows + int(equal.sum()), blocks + 1
            same_blocks += bool(equal.all())
            prefix += int(np.argmin(equal)) if not equal.all() else len(c)
    return {"rows": same_rows / rows, "blocks": same_blocks / blocks, "prefix": prefix / blocks}


@pytest.mark.parametrize("kind", ["vanilla", "gated"])
def test_report_lattice_walk_agreement_with_the_exact_head(kind, drafts, models):
    """Reported, not asserted: how often the lattice walk proposes what the exact head proposes, for several K."""
    cfg, weights = drafts[(kind, "f32")]
    backbone, _ = models[kind]
    for k in (4, TOP_K, 16):
        head = build_lattice_markov_head(cfg, weights, top_k=k)
        drafters = {m: DSparkDrafter(backbone, head, markov_mode=m, **F32) for m in ("chain", "lattice")}
        figures = agreement(drafters, steps=12, seed=21)
        print(
            f"{kind}, top_k {k}: lattice walk == exact head on {figures['rows']:.1%} of rows, "
            f"{figures['blocks']:.1%} of whole blocks; common prefix {figures['prefix']:.2f} of 7 rows"
        )


@pytest.mark.parametrize("kind", ["vanilla", "gated"])
def test_lattice_mode_is_lossless_and_report_both_modes_acceptance(kind, models):
    rng = np.random.default_rng(17)
    prompts = [rng.integers(0, 256, int(rng.integers(3, 45))).tolist() for _ in range(5)]
    config = GenerationConfig(max_new_tokens=20)

    def run(drafter):
        speculation = fixed_speculation(drafter)  # it drafts whatever the machine's load
        target = PagedModel(models["target"], num_blocks=64, **F32)
        scheduler = Scheduler(target, drafter, max_num_batched_tokens=64, speculation=speculation)
        requests = [scheduler.add_request(p, config) for p in prompts]
        scheduler.run()
        return [r.generated for r in requests], scheduler.metrics.requests

    alone, _ = run(None)
    report = []
    for mode in ("chain", "lattice"):
        generated, totals = run(DSparkDrafter(*models[kind], markov_mode=mode, **F32))
        assert generated == alone, f"{mode} mode is not lossless"
        per_draft = totals.num_accepted_tokens / totals.num_drafts
        report.append(f"{mode} {totals.num_accepted_tokens}/{totals.num_draft_tokens} accepted ({per_draft:.3f}/draft)")
    print(f"{kind}: " + "; ".join(report))

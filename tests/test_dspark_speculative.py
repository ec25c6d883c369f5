"""DSpark drafting at run time: proposals equal to the reference head, confidence truncation, lossless speculative
decoding with concurrent requests, and the drafter options through the pipeline."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from ovbuild.errors import ConfigError, UnsupportedError
from ovbuild.families import build_draft_models
from ovbuild.graph.dflash import build_dflash_draft
from ovbuild.graph.dspark import MARKOV_HEAD, build_dspark_draft, build_markov_head
from ovbuild.graph.target import build_target
from ovbuild.ir import save_ir
from ovbuild.reference.dspark import DSparkReference, confident_prefix
from ovbuild.runtime.model.paged_model import PagedModel
from ovbuild.runtime.pipeline import Pipeline, RuntimeOptions
from ovbuild.runtime.request import GenerationConfig
from ovbuild.runtime.scheduler import Scheduler
from ovbuild.runtime.speculation.drafters import DRAFTERS, DraftItem, DSparkDrafter
from ovbuild.runtime.speculation.drafters.dspark import confident_rows
from ovbuild.testing import TINY_TARGET
from ovbuild.testing.planner import fixed_speculation
from ovbuild.testing.steered import SteeredDrafter

from dspark_helpers import load_kind

F32 = dict(kv_cache_precision="f32")
VOCAB = TINY_TARGET["vocab_size"]


@pytest.fixture(scope="module")
def drafts(tmp_path_factory, tiny_target):
    """DSpark drafts whose embed_tokens and lm_head are copies of the target's, as DeepSpec ships them."""
    root = tmp_path_factory.mktemp("dspark_runtime")
    return {k: load_kind(root, k, tables_from=tiny_target) for k in ("vanilla", "gated", "deepspec_dflash")}


@pytest.fixture(scope="module")
def models(drafts, target):
    """Target IR with the DSpark taps, and every draft's backbone and chain head, built once."""
    tcfg, tweights = target
    taps = drafts["vanilla"][0].target_layer_ids
    built = {"target": build_target(tcfg, tweights, taps)}
    for kind, (cfg, weights) in drafts.items():
        assert cfg.target_layer_ids == taps
        head = build_markov_head(cfg, weights) if cfg.markov_rank else None
        built[kind] = (build_dspark_draft(cfg, weights, tweights), head)
    return built


def test_confidence_rule_by_hand():
    """Keep the rows before the first one strictly below the threshold; row 0 below -> nothing; 0 = off."""
    for rule in (confident_prefix, confident_rows):
        assert rule(np.array([0.9, 0.4, 0.8]), 0.5) == 1
        assert rule(np.array([0.3, 0.9]), 0.5) == 0
        assert rule(np.array([0.5, 0.5, 0.49]), 0.5) == 2  # equal to the threshold is kept
        assert rule(np.array([0.1, 0.2]), 0.0) == 2
        assert rule(np.array([0.6, 0.7]), 0.55) == 2


@pytest.mark.parametrize("kind", ["vanilla", "gated", "deepspec_dflash"])
def test_drafter_proposes_what_the_reference_head_proposes(kind, drafts, models, target):
    """Several steps of several packed sequences through DSparkDrafter.propose, against the reference step +
    sequential head + confidence rule (threshold 0.5 for the drafts with a confidence head)."""
    cfg, weights = drafts[kind]
    backbone, head = models[kind]
    threshold = 0.5 if cfg.enable_confidence_head else 0.0
    drafter = DSparkDrafter(backbone, head, confidence_threshold=threshold, **F32)
    ref = DSparkReference(cfg, weights, target[1])
    rng = np.random.default_rng(11)
    width = cfg.num_taps * cfg.target_hidden_size
    caches, cuts = {}, []
    for step in range(4):
        items = []
        for seq in range(4):
            context = rng.standard_normal((int(rng.integers(1, 9)), width)).astype(np.float32)
            anchor = None if (seq == 3 and step == 0) else int(rng.integers(0, 256))
            items.append(DraftItem(seq, context, anchor, int(rng.integers(3, 8))))
        proposals = drafter.propose(items)
        for item, proposal in zip(items, proposals, strict=True):
            cache = caches.setdefault(item.seq_id, ref.new_cache())
            if item.anchor is None:
                ref.forward(cache, item.context.astype(np.float64), np.zeros(0, np.int64))
                assert proposal == []
                continue
            logits, hidden = ref.step(cache, item.context.astype(np.float64), item.anchor, item.num_tokens)
            tokens, confidence = ref.sequential_head(logits, hidden, item.anchor)
            keep = confident_prefix(confidence, threshold) if confidence is not None else len(tokens)
            cuts.append(keep)
            assert proposal == tokens[: min(keep, item.num_tokens)].tolist(), f"step {step} sequence {item.seq_id}"
    if threshold:
        assert 0 in cuts and any(0 < c < 7 for c in cuts), f"the threshold never cut at row 0 or mid-block: {cuts}"


def run(scheduler: Scheduler, prompts: list[list[int]], config: GenerationConfig, truths=None) -> list[list[int]]:
    requests = [scheduler.add_request(p, config) for p in prompts]
    for request, truth in zip(requests, truths or [], strict=False):
        scheduler.drafter.truths[request.id] = [*request.prompt.tolist(), *truth]
    scheduler.run()
    return [r.generated for r in requests]


@pytest.mark.parametrize(
    "kind, threshold, k",
    [("vanilla", 0.0, None), ("gated", 0.0, 4), ("deepspec_dflash", 0.0, None), ("vanilla", 0.5, None)],
)
def test_lossless_with_concurrent_requests(kind, threshold, k, models):
    """The drafter as it is, then steered so that accepted prefixes of every length roll both caches back."""
    rng = np.random.default_rng(len(kind) * 7 + int(threshold * 10))
    prompts = [rng.integers(0, 256, int(rng.integers(3, 45))).tolist() for _ in range(5)]
    config = GenerationConfig(max_new_tokens=30, num_assistant_tokens=k)
    alone = run(
        Scheduler(PagedModel(models["target"], num_blocks=64, **F32), max_num_batched_tokens=64), prompts, config
    )
    drafter = DSparkDrafter(*models[kind], confidence_threshold=threshold, **F32)
    scheduler = Scheduler(PagedModel(models["target"], num_blocks=64, **F32), drafter, max_num_batched_tokens=64)
    assert run(scheduler, prompts, config) == alone
    totals = scheduler.metrics.requests
    print(
        f"{kind} chain, threshold {threshold}: {totals.num_accepted_tokens} of {totals.num_draft_tokens} draft tokens "
        f"accepted over {totals.num_drafts} drafts"
    )
    drafter = SteeredDrafter(DSparkDrafter(*models[kind], confidence_threshold=threshold, **F32), VOCAB, seed=7)
    scheduler = Scheduler(PagedModel(models["target"], num_blocks=64, **F32), drafter, max_num_batched_tokens=64)
    longest = k or drafter.max_candidates  # pinned: the adaptive choice depends on measured times
    pinned = GenerationConfig(max_new_tokens=30, num_assistant_tokens=longest)
    assert run(scheduler, prompts, pinned, truths=alone) == alone
    histogram = scheduler.metrics.requests.accepted_histogram
    assert len(histogram) == longest + 1 and all(histogram), f"accepted lengths 0..{longest} not all seen: {histogram}"


@pytest.fixture(scope="module")
def folders(tmp_path_factory, tiny_target, drafts, target):
    """Exported folders: target with tokenizer, a DSpark draft and a DFlash v1 draft."""
    root = tmp_path_factory.mktemp("exported")
    cfg, weights = drafts["vanilla"]
    save_ir(build_target(*target, cfg.target_layer_ids), root / "target" / "openvino_model.xml")
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "config.json"):
        shutil.copy(tiny_target / name, root / "target" / name)
    for stem, model in build_draft_models(cfg, weights, target[1]).items():
        save_ir(model, root / "dspark" / f"{stem}.xml")
    return root


def test_pipeline_threads_drafter_options(folders, draft, target, drafts):
    cfg, weights = drafts["vanilla"]
    prompts = ["def add(a, b):", "import os\n", "hello"]
    alone, _ = Pipeline(folders / "target").generate(prompts, 16)
    options = RuntimeOptions(draft_options={"confidence_threshold": 0.5})
    pipeline = Pipeline(folders / "target", folders / "dspark", options)
    assert isinstance(pipeline.drafter, DSparkDrafter) and pipeline.drafter.confidence_threshold == 0.5
    pipeline.speculation = fixed_speculation(pipeline.drafter)  # drafting pays whatever the machine's load
    assert pipeline.drafter.head is not None and (folders / "dspark" / f"{MARKOV_HEAD}.xml").exists()
    requests, metrics = pipeline.generate(prompts, 16)
    assert [r.generated for r in requests] == [r.generated for r in alone]
    assert metrics.requests.num_drafts > 0
    # exported heads hold the lattice next to the chain, so the lattice mode runs from the same folder
    lattice = Pipeline(folders / "target", folders / "dspark", RuntimeOptions(draft_options={"markov_mode": "lattice"}))
    assert [r.generated for r in lattice.generate(prompts, 16)[0]] == [r.generated for r in alone]
    chain_only = folders / "chain_only"
    save_ir(build_dspark_draft(cfg, weights, target[1]), chain_only / "openvino_model.xml")
    save_ir(build_markov_head(cfg, weights), chain_only / f"{MARKOV_HEAD}.xml")
    with pytest.raises(UnsupportedError, match="holds the chain form, not the lattice"):
        Pipeline(folders / "target", chain_only, RuntimeOptions(draft_options={"markov_mode": "lattice"}))
    save_ir(build_dflash_draft(*draft, target[1]), folders / "dflash" / "openvino_model.xml")
    with pytest.raises(ConfigError, match="a dflash draft takes no option 'confidence_threshold'"):
        Pipeline(folders / "target", folders / "dflash", options)
    assert DRAFTERS["dspark"] is DSparkDrafter


def test_bad_drafter_options_are_refused(models):
    backbone, head = models["deepspec_dflash"]
    with pytest.raises(UnsupportedError, match="this draft has no confidence head"):
        DSparkDrafter(backbone, head, confidence_threshold=0.3, **F32)
    with pytest.raises(ConfigError, match=r"confidence_threshold = 1.5 must lie in \[0, 1\]"):
        DSparkDrafter(*models["vanilla"], confidence_threshold=1.5, **F32)
    with pytest.raises(ConfigError, match="markov_mode 'beam' is not one of chain, lattice"):
        DSparkDrafter(*models["vanilla"], markov_mode="beam", **F32)
    with pytest.raises(ConfigError, match="this DSpark draft has a Markov head: pass its IR"):
        DSparkDrafter(models["vanilla"][0], None, **F32)
    with pytest.raises(UnsupportedError, match="markov_mode 'lattice': this draft has no Markov head"):
        DSparkDrafter(backbone, None, markov_mode="lattice", **F32)

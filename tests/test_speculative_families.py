"""Every registered draft family decodes losslessly through the same scheduler, with its own drafter plug-in."""

from __future__ import annotations

import numpy as np
import pytest
from test_prefix_caching import conversation_prompts, serve

from ovbuild.families import FAMILIES, build_draft_models, load_draft
from ovbuild.graph.target import build_target
from ovbuild.ir import save_ir
from ovbuild.runtime.model.paged_model import PagedModel
from ovbuild.runtime.request import GenerationConfig
from ovbuild.runtime.scheduler import Scheduler
from ovbuild.runtime.speculation.drafters import DRAFTERS
from ovbuild.testing import TINY_TARGET
from ovbuild.testing.steered import SteeredDrafter
from ovbuild.testing.tiny_dflash2 import write_tiny_dflash2, write_tiny_dflash2_short_window
from ovbuild.weights.checkpoint import Checkpoint

F32 = dict(kv_cache_precision="f32")
WRITERS = {name: write for family in FAMILIES for name, write in family.tiny.items()}  # every kind of every family


@pytest.fixture(scope="module", params=sorted(WRITERS))
def family_folders(request, tmp_path_factory, target):
    """(draft family, target IR with the draft's taps, exported draft folder)."""
    root = tmp_path_factory.mktemp(request.param)
    dcfg, dweights = load_draft(Checkpoint.open(WRITERS[request.param](root / "ckpt")))
    for stem, model in build_draft_models(dcfg, dweights, target[1]).items():
        save_ir(model, root / "draft" / f"{stem}.xml")
    return dcfg.family, build_target(target[0], target[1], dcfg.target_layer_ids), root / "draft"


@pytest.mark.parametrize("steer", [False, True])
def test_lossless_with_concurrent_requests(family_folders, steer):
    """The family's drafter as it is, and steered so that its caches roll back after accepted prefixes of every
    length (the tiny random drafts accept almost nothing by themselves)."""
    family, target_model, draft_dir = family_folders
    rng = np.random.default_rng(3)
    prompts = [rng.integers(0, 256, int(rng.integers(3, 40))).tolist() for _ in range(5)]
    # steered runs pin the draft lengths (the adaptive choice, None, depends on measured times)
    lengths = (7, 1, 3, 5, 7) if steer else (None, 1, 3, 5, None)
    configs = [GenerationConfig(max_new_tokens=30, num_assistant_tokens=k) for k in lengths]
    alone_scheduler = Scheduler(PagedModel(target_model, **F32), None, max_num_batched_tokens=48)
    alone = [alone_scheduler.add_request(p, c) for p, c in zip(prompts, configs, strict=True)]
    alone_scheduler.run()
    drafter = DRAFTERS[family].from_folder(draft_dir, **F32)
    if steer:
        drafter = SteeredDrafter(drafter, TINY_TARGET["vocab_size"], seed=3)
    scheduler = Scheduler(PagedModel(target_model, **F32), drafter, max_num_batched_tokens=48)
    requests = []
    for prompt, config, reference in zip(prompts, configs, alone, strict=True):
        requests.append(scheduler.add_request(prompt, config))
        if steer:
            drafter.truths[requests[-1].id] = [*prompt, *reference.generated]
    scheduler.run()
    assert [r.generated for r in requests] == [r.generated for r in alone]
    totals = scheduler.metrics.requests
    assert totals.num_draft_tokens > 0
    if steer:
        histogram = totals.accepted_histogram
        assert len(histogram) == 8 and all(histogram), f"accepted-prefix lengths 0..7 not all seen: {histogram}"
        for allocator in (scheduler.target.cache.allocator, drafter.inner.model.cache.allocator):
            assert allocator.free_blocks == allocator.num_blocks


def test_sampling_is_reproducible_and_point_mass_families_give_the_target_alone_tokens(family_folders):
    """DFlash v2 and DSpark propose deterministically (point masses): same seed, the target alone's tokens. DeepSpec
    DFlash samples its proposals: same seed, same tokens."""
    family, target_model, draft_dir = family_folders
    prompt = [3, 14, 15, 92, 65]
    results = []
    for drafter in (
        None,
        DRAFTERS[family].from_folder(draft_dir, **F32),
        DRAFTERS[family].from_folder(draft_dir, **F32),
    ):
        scheduler = Scheduler(PagedModel(target_model, **F32), drafter, max_num_batched_tokens=48)
        configs = [GenerationConfig(max_new_tokens=10, do_sample=True, top_k=8, rng_seed=s) for s in range(3)]
        requests = [scheduler.add_request(prompt, c) for c in configs]
        scheduler.run()
        results.append([r.generated for r in requests])
    assert results[1] == results[2]
    if getattr(drafter, "head", None) is not None:  # a lattice or Markov head: deterministic proposals
        assert results[0] == results[1]


@pytest.mark.parametrize("writer", [write_tiny_dflash2, write_tiny_dflash2_short_window])
def test_dflash2_drafter_proposes_the_reference_walk(tmp_path, target, writer):
    """Window 10 above block 8, and window 4 below block 7."""
    from ovbuild.reference.dflash2 import greedy_walk
    from ovbuild.runtime.speculation.drafters import DraftItem
    from ovbuild.testing.references import REFERENCES as DRAFT_REFERENCES

    dcfg, dweights = load_draft(Checkpoint.open(writer(tmp_path / "ckpt")))
    for stem, model in build_draft_models(dcfg, dweights, target[1]).items():
        save_ir(model, tmp_path / "draft" / f"{stem}.xml")
    drafter = DRAFTERS["dflash2"].from_folder(tmp_path / "draft", **F32)
    ref = DRAFT_REFERENCES["dflash2"](dcfg, dweights, target[1])
    rng = np.random.default_rng(0)
    width = dcfg.num_taps * dcfg.target_hidden_size
    items = [
        DraftItem(seq, rng.standard_normal((n, width)).astype(np.float32), anchor, k)
        for seq, n, anchor, k in ((0, 9, 17, drafter.max_candidates), (1, 4, 40, 3), (2, 12, None, 0))
    ]
    proposals = drafter.propose(items)
    for item, proposal in zip(items, proposals, strict=True):
        if item.anchor is None:
            assert proposal == []
            continue
        # the drafter runs a block only as long as the proposals need (candidate offset 1: k + 1 rows)
        block = np.array([item.anchor] + [dcfg.mask_token_id] * item.num_tokens)
        logits, hidden = ref.forward(ref.new_cache(), item.context.astype(np.float64), block)
        expected = greedy_walk(*ref.lattice(logits, hidden, item.anchor))[: item.num_tokens]
        assert proposal == expected.tolist()


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_prefix_caching_and_preemption_keep_the_family_exact(family_folders, sampled):
    """The family's drafter starts on cached prefixes (its context rows reused with the target's blocks), and is
    preempted in a pool too small for all requests at once: outputs equal the target alone without caching, greedy
    and sampled with a seed (the draft length pinned: the adaptive choice depends on measured times)."""
    family, target_model, draft_dir = family_folders
    rng = np.random.default_rng(5)
    runs = {  # pool size -> prompts in waves, new tokens
        64: (lambda p: [p[:1], p[1:5]])(conversation_prompts()),
        6: [[rng.integers(0, 256, int(rng.integers(20, 60))).tolist() for _ in range(5)]],
    }
    for num_blocks, waves in runs.items():
        config = GenerationConfig(
            max_new_tokens=12 if num_blocks == 64 else 40, num_assistant_tokens=3, do_sample=sampled, top_k=16
        )
        alone = Scheduler(PagedModel(target_model, num_blocks=64, **F32), None, enable_prefix_caching=False)
        reference = [r.generated for r in serve(alone, waves, config)]
        drafter = DRAFTERS[family].from_folder(draft_dir, **F32)
        scheduler = Scheduler(PagedModel(target_model, num_blocks=num_blocks, **F32), drafter)
        requests = serve(scheduler, waves, config)
        assert [r.generated for r in requests] == reference, f"{num_blocks} blocks"
        assert scheduler.metrics.requests.num_draft_tokens > 0
        if num_blocks == 64:
            assert scheduler.metrics.prefix_cache_hits > 0 and scheduler.metrics.catch_up_rows == 0
        else:
            assert scheduler.metrics.num_preemptions > 0

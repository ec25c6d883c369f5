"""Prefix caching on the tiny hybrid target (Gated DeltaNet + full attention): a hit resumes the linear-attention
state from the last snapshot within the cached blocks, and outputs equal a run without caching, target alone and
with the DFlash draft, greedy and sampled with a seed, with and without preemption."""

from __future__ import annotations

import pytest
from test_hybrid_speculative import hybrid  # noqa: F401 (the module fixture)
from test_prefix_caching import GREEDY, SAMPLED, conversation_prompts, serve

from ovbuild.runtime.model.paged_model import PagedModel
from ovbuild.runtime.request import GenerationConfig
from ovbuild.runtime.scheduler import Scheduler
from ovbuild.runtime.speculation.drafters import BlockDrafter

F32 = dict(kv_cache_precision="f32")


def make(hybrid, caching: bool, with_draft: bool, interval_blocks: int = 1, num_blocks: int = 64) -> Scheduler:  # noqa: F811
    _, target_ir, draft_ir = hybrid
    target = PagedModel(target_ir, num_blocks=num_blocks, state_slots=4, **F32)
    target.cache_manager.keep_snapshots(interval_blocks * target.cache.block_size, 16)
    drafter = BlockDrafter(draft_ir, num_blocks=64, **F32) if with_draft else None
    return Scheduler(target, drafter, max_num_batched_tokens=64, enable_prefix_caching=caching)


@pytest.mark.parametrize("with_draft", [False, True], ids=["alone", "draft"])
@pytest.mark.parametrize("config", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_hybrid_outputs_equal_with_and_without_prefix_caching(hybrid, config, with_draft):  # noqa: F811
    prompts = conversation_prompts()
    waves = [prompts[:1], prompts[1:5], prompts[5:]]
    if with_draft:
        config = GenerationConfig(**{**config.__dict__, "num_assistant_tokens": 3})
    reference = [r.generated for r in serve(make(hybrid, False, with_draft), waves, config)]
    scheduler = make(hybrid, True, with_draft)
    block = scheduler.target.cache.block_size
    requests = serve(scheduler, waves, config)
    assert [r.generated for r in requests] == reference
    expected = [0, 2 * 32 // block, 3 * 32 // block, 2 * 32 // block, 3 * 32 // block, 0]
    assert [r.num_cached_tokens // block for r in requests] == expected
    cache = scheduler.target.cache_manager
    assert cache.states.free_slots == cache.states.num_slots and cache.snapshots


def test_a_hit_resumes_from_the_last_snapshot_within_the_cached_blocks(hybrid):  # noqa: F811
    """Snapshots every 2 blocks: a prompt sharing 3 cached blocks resumes after 2 (the state there is kept), and
    still generates what a run without caching does."""
    prompt = conversation_prompts()[2]  # 140 tokens
    reference = serve(make(hybrid, False, False, interval_blocks=2), [[prompt]], GREEDY)[0].generated
    scheduler = make(hybrid, True, False, interval_blocks=2)
    block = scheduler.target.cache.block_size
    first, again = serve(scheduler, [[prompt], [prompt[:100] + prompt[:20]]], GREEDY)
    assert first.generated == reference
    assert again.num_cached_tokens == (100 // block) // 2 * 2 * block
    assert first.num_cached_tokens == 0


def test_hybrid_preemption_leaves_outputs_unchanged(hybrid):  # noqa: F811
    prompts = conversation_prompts()[:4]
    config = GenerationConfig(max_new_tokens=30)
    reference = [r.generated for r in serve(make(hybrid, False, False), [prompts], config)]
    scheduler = make(hybrid, True, False, num_blocks=8)
    requests = serve(scheduler, [prompts], config)
    assert [r.generated for r in requests] == reference
    assert scheduler.metrics.num_preemptions > 0

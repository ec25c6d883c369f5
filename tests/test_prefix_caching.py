"""Prefix caching and preemption keep every output exact: the same tokens with and without cached prefixes, with and
without preemptions, greedy and sampled with a seed, on the tiny target alone and with a draft; blocks are shared by
reference count and come back to the pool, whatever arrives, aborts or is preempted."""

from __future__ import annotations

import numpy as np
import pytest

from ovbuild.errors import CacheExhaustedError
from ovbuild.runtime.model.paged_model import PagedModel
from ovbuild.runtime.request import FinishReason, GenerationConfig, Request
from ovbuild.runtime.scheduler import Scheduler
from ovbuild.runtime.speculation.drafters import BlockDrafter

F32 = dict(kv_cache_precision="f32")
BLOCK = 32  # the tiny target's cache block size on CPU
GREEDY = GenerationConfig(max_new_tokens=12)
SAMPLED = GenerationConfig(max_new_tokens=12, do_sample=True, top_k=20, temperature=0.9, rng_seed=11)


def conversation_prompts(seed: int = 0) -> list[list[int]]:
    """Prompts sharing a system prefix: some are prefixes of others, two are identical, hits end mid-block."""
    rng = np.random.default_rng(seed)
    system = rng.integers(0, 256, 70).tolist()  # 2 whole blocks and 6 tokens of a third
    a = system + rng.integers(0, 256, 30).tolist()
    return [
        a,
        a[:75],  # a prefix of `a`, ending mid-block
        a + rng.integers(0, 256, 40).tolist(),  # `a` continued: hits `a`'s blocks
        system + rng.integers(0, 256, 5).tolist(),  # the system prompt, another ending
        list(a),  # identical to the first
        rng.integers(0, 256, 50).tolist(),  # nothing shared
    ]


def serve(scheduler: Scheduler, waves: list[list[list[int]]], config: GenerationConfig) -> list[Request]:
    """Each wave's prompts added together once the wave before has finished (later waves hit its blocks)."""
    requests = []
    for wave in waves:
        requests += [scheduler.add_request(p, config) for p in wave]
        while scheduler.has_unfinished():
            scheduler.step()
            for cache in scheduler.caches.values():
                allocator = getattr(cache, "blocks", cache)
                allocator.check()
    for cache in scheduler.caches.values():
        allocator = getattr(cache, "blocks", cache)
        assert allocator.free_blocks == allocator.num_blocks and not allocator.tables
        assert all(r == 0 for r in allocator.refs)
    return requests


def target_scheduler(models, caching: bool, num_blocks: int = 64, drafter=None, **kwargs) -> Scheduler:
    target = PagedModel(models[0], num_blocks=num_blocks, **F32)
    return Scheduler(target, drafter, max_num_batched_tokens=64, enable_prefix_caching=caching, **kwargs)


@pytest.mark.parametrize("config", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_target_alone_outputs_equal_with_and_without_prefix_caching(models, config):
    prompts = conversation_prompts()
    waves = [prompts[:1], prompts[1:5], prompts[5:]]  # identical prompts, prefixes of one another, one step apart
    reference = [r.generated for r in serve(target_scheduler(models, False), waves, config)]
    scheduler = target_scheduler(models, True)
    cached = serve(scheduler, waves, config)
    assert [r.generated for r in cached] == reference
    hits = [r.num_cached_tokens for r in cached]
    # whole blocks only, never the last prompt token: a[:75] and the system prompt + 5 hit 2 blocks, `a` continued 3
    assert hits == [0, 2 * BLOCK, 3 * BLOCK, 2 * BLOCK, 3 * BLOCK, 0]
    assert scheduler.metrics.prefix_cache_hits == sum(hits)
    assert scheduler.metrics.prefix_cache_queries == sum(len(p) for p in prompts)


def test_identical_prompts_queued_together_wait_for_the_first_ones_blocks(models):
    """Two identical prompts queued together: the second is admitted once the first's prefill is committed and starts
    on its blocks, as does a third request later."""
    prompt = conversation_prompts()[0]
    scheduler = target_scheduler(models, True)
    first = serve(scheduler, [[prompt, prompt]], GREEDY)
    third = serve(scheduler, [[prompt]], GREEDY)
    assert [r.num_cached_tokens for r in first + third] == [0, 3 * BLOCK, 3 * BLOCK]
    assert first[0].generated == first[1].generated == third[0].generated


@pytest.mark.parametrize("config", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_forced_preemption_leaves_outputs_unchanged(models, config):
    """A pool too small for all requests at once: running requests are preempted, recomputed later (their committed
    tokens joined to their prompt), and every output equals a run with room for everyone."""
    rng = np.random.default_rng(5)
    prompts = [rng.integers(0, 256, int(rng.integers(20, 60))).tolist() for _ in range(6)]
    config = GenerationConfig(**{**config.__dict__, "max_new_tokens": 40})
    reference = [r.generated for r in serve(target_scheduler(models, False), [prompts], config)]
    for caching in (False, True):
        scheduler = target_scheduler(models, caching, num_blocks=6)
        requests = serve(scheduler, [prompts], config)
        assert [r.generated for r in requests] == reference
        assert scheduler.metrics.num_preemptions > 0
        assert sum(r.num_preemptions for r in requests) == scheduler.metrics.num_preemptions


def test_a_request_that_cannot_fit_alone_is_refused_when_added(models):
    scheduler = target_scheduler(models, True, num_blocks=4)
    with pytest.raises(CacheExhaustedError, match="does not fit the target cache even when it is empty"):
        scheduler.add_request(list(range(100)), GenerationConfig(max_new_tokens=40))
    assert not scheduler.has_unfinished()


def test_an_aborted_request_frees_its_blocks_and_leaves_its_full_blocks_reusable(models):
    prompt = conversation_prompts()[2]  # 140 tokens: 4 whole blocks
    scheduler = target_scheduler(models, True)
    request = scheduler.add_request(prompt, GenerationConfig(max_new_tokens=200))
    while len(request.generated) < 3:
        scheduler.step()
    scheduler.abort(request)
    allocator = scheduler.target.cache.allocator
    allocator.check()
    assert request.finish_reason is FinishReason.ABORT and request.finish_reason == "abort"
    assert allocator.free_blocks == allocator.num_blocks and len(allocator.cached) == 4
    again = serve(scheduler, [[prompt]], GREEDY)[0]
    assert again.num_cached_tokens == 4 * BLOCK
    assert again.generated == request.generated[:1] + again.generated[1:] and again.generated[:3] == request.generated


def test_a_cache_for_32_x_300_tokens_runs_32_requests_of_200_at_once(models):
    """Blocks on demand: 32 prompts of 200 tokens with max_new_tokens 2048 all run at once in a cache sized for
    32 x 300 tokens while they generate 64 tokens each (reserving 2,248 tokens each, 4 would fit)."""
    rng = np.random.default_rng(2)
    scheduler = target_scheduler(models, True, num_blocks=32 * 300 // BLOCK)
    scheduler.max_num_batched_tokens = 32 * 201
    config = GenerationConfig(max_new_tokens=2048)
    requests = [scheduler.add_request(rng.integers(0, 256, 200).tolist(), config) for _ in range(32)]
    scheduler.step()
    assert len(scheduler.running) == 32 and not scheduler.waiting
    while min(len(r.generated) for r in requests) < 64:
        scheduler.step()
        assert len(scheduler.running) == 32
    assert scheduler.metrics.num_preemptions == 0
    scheduler.abort_all()
    assert scheduler.target.cache.allocator.free_blocks == 32 * 300 // BLOCK


def test_max_num_seqs_caps_the_running_batch(models):
    rng = np.random.default_rng(4)
    scheduler = target_scheduler(models, True, max_num_seqs=2)
    requests = [scheduler.add_request(rng.integers(0, 256, 10).tolist(), GREEDY) for _ in range(5)]
    while scheduler.has_unfinished():
        scheduler.step()
        assert len(scheduler.running) <= 2
    assert all(r.finish_reason == "length" for r in requests)


def run_random(models, seed: int, num_blocks: int) -> Scheduler:
    """Random arrivals (prompts cut from three shared stems), aborts and sampling over a pool of `num_blocks`; checks
    the allocator's counts after every step and each request that was not aborted against a run without caching."""
    rng = np.random.default_rng(100 + seed)
    stems = [rng.integers(0, 256, int(rng.integers(30, 80))).tolist() for _ in range(3)]
    arrivals = []
    for _ in range(10):
        stem = stems[int(rng.integers(0, 3))]
        prompt = stem[: int(rng.integers(10, len(stem) + 1))] + rng.integers(0, 256, int(rng.integers(1, 20))).tolist()
        abort_at = int(rng.integers(1, 20)) if rng.random() < 0.3 else None
        arrivals.append((int(rng.integers(0, 40)), prompt, abort_at))
    config = GenerationConfig(max_new_tokens=int(rng.integers(8, 30)), do_sample=bool(seed % 2), rng_seed=seed)
    reference = target_scheduler(models, False, num_blocks=128)
    expected = {i: reference.add_request(p, config) for i, (_, p, _) in enumerate(arrivals)}
    reference.run()
    scheduler = target_scheduler(models, True, num_blocks=num_blocks)
    requests: dict[int, tuple[Request, int | None]] = {}
    step = 0
    while step < 40 or scheduler.has_unfinished():
        for i, (at, prompt, abort_at) in enumerate(arrivals):
            if at == step:
                requests[i] = (scheduler.add_request(prompt, config), None if abort_at is None else step + abort_at)
        for request, abort_at in requests.values():
            if abort_at == step and request.finish_reason is None:
                scheduler.abort(request)
        scheduler.step()
        scheduler.target.cache.allocator.check()
        step += 1
    allocator = scheduler.target.cache.allocator
    assert allocator.free_blocks == allocator.num_blocks and all(r == 0 for r in allocator.refs)
    finished = [i for i, (r, _) in requests.items() if r.finish_reason != "abort"]
    assert finished
    for i in finished:
        assert requests[i][0].generated == expected[i].generated, f"seed {seed}, request {i}"
    return scheduler


def test_random_arrivals_aborts_preemptions_and_hits_over_tiny_pools(models):
    """No block leaks or is freed twice (the allocator's counts are checked after every step), every reference count
    returns to zero, and each request that was not aborted generates what a run without caching does."""
    runs = [run_random(models, seed, num_blocks=6 + seed % 3) for seed in range(4)]
    assert sum(s.metrics.prefix_cache_hits for s in runs) > 0
    assert sum(s.metrics.num_preemptions for s in runs) > 0
    assert all(s.metrics.prefix_cache_hits or s.metrics.num_preemptions for s in runs)


@pytest.mark.parametrize("config", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_draft_context_rows_of_a_cached_prefix_are_reused(models, config):
    """With the DFlash draft, a hit starts both caches on the prefix: the draft's context rows are not recomputed
    (no target taps for them: the target runs only the rows past the hit) and outputs equal the target alone's."""
    prompts = conversation_prompts()
    waves = [prompts[:1], prompts[1:5], prompts[5:]]
    config = GenerationConfig(**{**config.__dict__, "num_assistant_tokens": 4})
    reference = [r.generated for r in serve(target_scheduler(models, False), waves, config)]
    runs = {}
    for caching in (False, True):
        drafter = BlockDrafter(models[1], num_blocks=64, **F32)
        scheduler = target_scheduler(models, caching, drafter=drafter)
        requests = serve(scheduler, waves, config)
        assert [r.generated for r in requests] == reference
        assert scheduler.metrics.requests.num_draft_tokens > 0
        runs[caching] = scheduler, requests
    scheduler, requests = runs[True]
    assert [r.num_cached_tokens for r in requests] == [0, 2 * BLOCK, 3 * BLOCK, 2 * BLOCK, 3 * BLOCK, 0]
    assert scheduler.metrics.catch_up_rows == 0  # no taps of a cached prefix were computed again


def test_a_draft_without_the_cached_rows_catches_up_from_the_target_hit(models):
    """The target's cache holds the prefix, a fresh draft's does not: the request starts on the target's hit and the
    target computes the missing taps again before the request drafts (a gap, ovbuild.runtime.catch_up)."""
    prompts = conversation_prompts()
    config = GenerationConfig(max_new_tokens=12, num_assistant_tokens=4)
    reference = [r.generated for r in serve(target_scheduler(models, False), [prompts[:1], prompts[2:3]], config)]
    target = PagedModel(models[0], num_blocks=64, **F32)
    outputs = []
    for prompt in (prompts[0], prompts[2]):
        drafter = BlockDrafter(models[1], num_blocks=64, **F32)  # a new draft cache each time
        scheduler = Scheduler(target, drafter, max_num_batched_tokens=64)
        outputs += serve(scheduler, [[prompt]], config)
    assert [r.generated for r in outputs] == reference
    assert outputs[1].num_cached_tokens == 3 * BLOCK and scheduler.metrics.catch_up_rows >= 3 * BLOCK


def test_a_prompt_of_whole_blocks_hits_all_but_its_last_block(models):
    """The last context token's row must run (its logits give the first token): a repeated prompt of 2 whole blocks
    starts on the first block only. Driven through the plan/apply interface: schedule() says the hit, execute() runs
    the target, update() commits."""
    prompt = conversation_prompts()[0][: 2 * BLOCK]
    scheduler = target_scheduler(models, True)
    (first,) = serve(scheduler, [[prompt]], GREEDY)
    again = scheduler.add_request(prompt, GREEDY)
    plan = scheduler.schedule()
    assert plan.hits == {again.id: BLOCK} and plan.admitted == [again] and not plan.preempted
    assert [(part.request, part.start, len(part.tokens)) for part in plan.rows] == [(again, BLOCK, BLOCK)]
    # taken from the free queue: the cached first block (nobody held it) and two of its own, for the second block
    # and the row of its first decode step
    assert plan.new_blocks == {"target": 3} and scheduler.target.cache.allocator.refs.count(1) == 3
    scheduler.update(plan, scheduler.execute(plan))
    while scheduler.has_unfinished():
        scheduler.step()
    assert again.generated == first.generated


def test_samples_of_one_prompt_queued_together_share_its_blocks(models):
    """n samples of a prompt added at once: the first prefills, the others wait for its blocks and start on them,
    and each sample's tokens are those it draws alone."""
    prompt = conversation_prompts()[2]
    configs = [GenerationConfig(max_new_tokens=6, do_sample=True, temperature=0.9, rng_seed=seed) for seed in range(4)]
    scheduler = target_scheduler(models, True)
    together = [scheduler.add_request(prompt, c) for c in configs]
    scheduler.run()
    assert together[0].num_cached_tokens == 0
    assert all(r.num_cached_tokens >= len(prompt) - 32 for r in together[1:])
    for request, config in zip(together, configs, strict=True):
        alone = target_scheduler(models, False)
        assert alone.add_request(prompt, config) and alone.run()[0].generated == request.generated

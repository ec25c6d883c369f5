"""Speculative decoding with continuous batching is lossless: every request's tokens equal the target alone."""

from __future__ import annotations

import numpy as np
import pytest

from ovbuild.errors import CacheExhaustedError, UnsupportedError
from ovbuild.graph.dflash import build_dflash_draft
from ovbuild.graph.target import build_target
from ovbuild.runtime.drafters import BlockDrafter
from ovbuild.runtime.paged_model import PagedModel
from ovbuild.runtime.reference.qwen3 import Qwen3Reference
from ovbuild.runtime.request import GenerationConfig
from ovbuild.runtime.scheduler import Scheduler

F32 = dict(kv_cache_precision="f32")


@pytest.fixture(scope="module")
def models(target, draft):
    """Target IR with the draft's taps and the draft IR, built once."""
    tcfg, tweights = target
    dcfg, dweights = draft
    return build_target(tcfg, tweights, dcfg.target_layer_ids), build_dflash_draft(dcfg, dweights, tweights)


def make_scheduler(
    models, with_draft: bool, num_blocks: int = 64, max_num_batched_tokens: int = 64, draft_blocks: int = 64
):
    target_model, draft_model = models
    target = PagedModel(target_model, num_blocks=num_blocks, **F32)
    drafter = BlockDrafter(draft_model, num_blocks=draft_blocks, **F32) if with_draft else None
    return Scheduler(target, drafter, max_num_batched_tokens=max_num_batched_tokens, trace=True)


def run(scheduler: Scheduler, arrivals: list[tuple[int, list[int], GenerationConfig]]) -> list[list[int]]:
    """arrivals: (step at which the request is added, prompt, config); returns each request's generated tokens."""
    pending = sorted(enumerate(arrivals), key=lambda x: x[1][0])
    requests, step = {}, 0
    while pending or scheduler.has_unfinished():
        while pending and pending[0][1][0] <= step:
            index, (_, prompt, config) = pending.pop(0)
            requests[index] = scheduler.add_request(prompt, config)
        scheduler.step()
        step += 1
    return [requests[i].generated for i in range(len(arrivals))]


def prompts(rng, n: int) -> list[list[int]]:
    return [rng.integers(0, 256, int(rng.integers(3, 45))).tolist() for _ in range(n)]


def test_target_alone_matches_the_numpy_reference_greedy_decode(models, target):
    prompt = list(range(60, 80))
    (generated,) = run(make_scheduler(models, with_draft=False), [(0, prompt, GenerationConfig(max_new_tokens=12))])
    ref = Qwen3Reference(*target)
    cache, tokens, expected = ref.new_cache(), np.array(prompt), []
    for _ in range(12):
        logits, _ = ref.forward(cache, tokens)
        expected.append(int(logits[-1].argmax()))
        tokens = np.array(expected[-1:])
    assert generated == expected


@pytest.mark.parametrize("num_requests", [1, 3, 8])
@pytest.mark.parametrize("k", [1, 3, 7])
def test_lossless_with_concurrent_requests(models, num_requests, k):
    rng = np.random.default_rng(num_requests * 10 + k)
    config = GenerationConfig(max_new_tokens=int(rng.integers(8, 20)), num_assistant_tokens=k)
    arrivals = [(int(rng.integers(0, 4)), p, config) for p in prompts(rng, num_requests)]
    alone = run(make_scheduler(models, with_draft=False), arrivals)
    spec_scheduler = make_scheduler(models, with_draft=True)
    speculative = run(spec_scheduler, arrivals)
    assert speculative == alone
    totals = spec_scheduler.metrics.requests
    assert totals.num_draft_tokens > 0 and totals.num_drafts > 0
    assert all(len(step["proposed"]) <= k for r in spec_scheduler.finished for step in r.trace)


def test_random_schedules_are_lossless_and_return_every_block(models):
    """Random arrivals, prompt lengths, budgets, EOS tokens and cache sizes that force requests to queue."""
    rng = np.random.default_rng(1234)
    for trial in range(6):
        n = int(rng.integers(2, 7))
        arrivals = []
        for prompt in prompts(rng, n):
            eos = tuple(int(t) for t in rng.integers(0, 320, int(rng.integers(0, 4))))
            config = GenerationConfig(
                max_new_tokens=int(rng.integers(1, 25)), eos_token_ids=eos, num_assistant_tokens=int(rng.integers(0, 8))
            )
            arrivals.append((int(rng.integers(0, 6)), prompt, config))
        num_blocks = int(rng.integers(3, 9))  # small: some requests must wait for others to finish
        budget = int(rng.integers(8, 80))
        alone_scheduler = make_scheduler(models, False, num_blocks, budget)
        spec_scheduler = make_scheduler(models, True, num_blocks, budget, draft_blocks=int(rng.integers(3, 9)))
        assert run(spec_scheduler, arrivals) == run(alone_scheduler, arrivals), f"trial {trial}"
        for scheduler in (alone_scheduler, spec_scheduler):
            allocator = scheduler.target.cache.allocator
            assert allocator.free_blocks == allocator.num_blocks and not allocator.tables
        draft_allocator = spec_scheduler.drafter.model.cache.allocator
        assert draft_allocator.free_blocks == draft_allocator.num_blocks and not draft_allocator.tables


def test_request_larger_than_the_whole_cache_fails_cleanly(models):
    scheduler = make_scheduler(models, with_draft=True, num_blocks=2)
    with pytest.raises(CacheExhaustedError, match="needs 4 target cache blocks; the cache has 2"):
        scheduler.add_request(list(range(50)), GenerationConfig(max_new_tokens=40))
    assert not scheduler.has_unfinished()
    small_draft = make_scheduler(models, with_draft=True, num_blocks=64, draft_blocks=1)
    with pytest.raises(CacheExhaustedError, match="does not fit the draft cache"):
        small_draft.add_request(list(range(30)), GenerationConfig(max_new_tokens=10))


def test_too_many_assistant_tokens_is_refused(models):
    scheduler = make_scheduler(models, with_draft=True)
    with pytest.raises(UnsupportedError, match="at most 7 tokens per step"):
        scheduler.add_request([1, 2, 3], GenerationConfig(num_assistant_tokens=8))


def test_metrics_add_up(models):
    scheduler = make_scheduler(models, with_draft=True)
    rng = np.random.default_rng(5)
    run(scheduler, [(0, p, GenerationConfig(max_new_tokens=16)) for p in prompts(rng, 4)])
    totals = scheduler.metrics.requests
    assert totals.num_generated_tokens == sum(len(r.generated) for r in scheduler.finished) == 64
    assert sum(totals.accepted_histogram) == totals.num_drafts
    assert sum(i * c for i, c in enumerate(totals.accepted_histogram)) == totals.num_accepted_tokens
    assert totals.accepted_per_position[0] == totals.num_drafts - totals.accepted_histogram[0]
    for r in scheduler.finished:
        assert r.metrics.ttft is not None and r.metrics.ttft > 0
        assert sum(s["accepted"] for s in r.trace) == r.metrics.num_accepted_tokens


def test_default_runtime_options_are_exact(models):
    """The pipeline defaults (f16 target cache, f32 target math, u8 draft cache) keep speculation lossless."""
    from ovbuild.runtime.pipeline import EXACT_TARGET, FAST_DRAFT

    target_model, draft_model = models
    rng = np.random.default_rng(99)
    arrivals = [(int(rng.integers(0, 3)), p, GenerationConfig(max_new_tokens=24)) for p in prompts(rng, 12)]
    results = []
    fast = dict(kv_cache_precision=FAST_DRAFT.kv_cache_precision, inference_precision=FAST_DRAFT.inference_precision)
    for drafter in (None, BlockDrafter(draft_model, **fast)):
        target = PagedModel(target_model, "CPU", EXACT_TARGET.kv_cache_precision, EXACT_TARGET.inference_precision)
        results.append(run(Scheduler(target, drafter), arrivals))
    assert results[0] == results[1]

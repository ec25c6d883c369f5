"""Speculative decoding with continuous batching is lossless: every request's tokens equal the target alone."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from ovbuild.errors import CacheExhaustedError, UnsupportedError
from ovbuild.reference.qwen3 import Qwen3Reference
from ovbuild.runtime.model.paged_model import PagedModel
from ovbuild.runtime.request import GenerationConfig
from ovbuild.runtime.scheduler import Scheduler
from ovbuild.runtime.speculation.drafters import BlockDrafter
from ovbuild.testing import TINY_TARGET
from ovbuild.testing.planner import fixed_speculation
from ovbuild.testing.steered import SteeredDrafter

F32 = dict(kv_cache_precision="f32")
VOCAB = TINY_TARGET["vocab_size"]


def make_scheduler(
    models,
    with_draft: bool,
    num_blocks: int = 64,
    max_num_batched_tokens: int = 64,
    draft_blocks: int = 64,
    steer_seed: int | None = None,
):
    """A scheduler on the tiny pair; `steer_seed` wraps the draft in a SteeredDrafter so that tokens get accepted.
    Its planner has fixed costs, so that what adaptive requests draft does not depend on the machine's load."""
    target_model, draft_model = models
    target = PagedModel(target_model, num_blocks=num_blocks, **F32)
    drafter = BlockDrafter(draft_model, num_blocks=draft_blocks, **F32) if with_draft else None
    if drafter is not None and steer_seed is not None:
        drafter = SteeredDrafter(drafter, VOCAB, seed=steer_seed)
    speculation = fixed_speculation(drafter)
    return Scheduler(
        target, drafter, max_num_batched_tokens=max_num_batched_tokens, trace=True, speculation=speculation
    )


def run(
    scheduler: Scheduler,
    arrivals: list[tuple[int, list[int], GenerationConfig]],
    truths: list[list[int]] | None = None,
) -> list[list[int]]:
    """arrivals: (step at which the request is added, prompt, config); returns each request's generated tokens.
    `truths` (the target alone's tokens per arrival) steer a SteeredDrafter's proposals."""
    pending = sorted(enumerate(arrivals), key=lambda x: x[1][0])
    requests, step = {}, 0
    while pending or scheduler.has_unfinished():
        while pending and pending[0][1][0] <= step:
            index, (_, prompt, config) = pending.pop(0)
            requests[index] = scheduler.add_request(prompt, config)
            if truths is not None:
                scheduler.drafter.truths[requests[index].id] = [*prompt, *truths[index]]
        scheduler.step()
        step += 1
    return [requests[i].generated for i in range(len(arrivals))]


def assert_accepted(scheduler: Scheduler, k: int, every_length: bool = True) -> None:
    """Speculation really ran: tokens were accepted, whole proposals were accepted and rejected at the first token,
    and (`every_length`) every accepted-prefix length 0..k occurred."""
    totals = scheduler.metrics.requests
    histogram = totals.accepted_histogram
    assert totals.num_accepted_tokens > 0, "no draft token was accepted"
    assert len(histogram) == k + 1 and histogram[0] and histogram[k], f"no full or no empty acceptance: {histogram}"
    assert all(histogram) or not every_length, f"accepted-prefix lengths 0..{k} not all seen: {histogram}"


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
    config = GenerationConfig(max_new_tokens=int(rng.integers(24, 40)), num_assistant_tokens=k)
    arrivals = [(int(rng.integers(0, 4)), p, config) for p in prompts(rng, num_requests)]
    alone = run(make_scheduler(models, with_draft=False), arrivals)
    # the tiny draft itself, then steered so that every accepted-prefix length occurs
    raw = make_scheduler(models, with_draft=True)
    assert run(raw, arrivals) == alone
    steered = make_scheduler(models, with_draft=True, steer_seed=k)
    assert run(steered, arrivals, truths=alone) == alone
    assert all(len(step["proposed"]) <= k for r in steered.finished for step in r.trace)
    if num_requests == 1:
        assert steered.metrics.requests.num_accepted_tokens > 0
    else:
        assert_accepted(steered, k, every_length=num_requests == 8)


def test_verification_rows_are_subsequences_of_their_own(models, monkeypatch):
    """On CPU each verification row runs as a 1-row subsequence, the kernel a decode step of the target alone runs
    (with bf16 math a k-row subsequence rounds otherwise and speculation diverged). Checked on the calls themselves:
    at f32 math, with static row counts, the tokens would not show it."""
    rng = np.random.default_rng(21)
    config = GenerationConfig(max_new_tokens=20, num_assistant_tokens=5)
    arrivals = [(i, p, config) for i, p in enumerate(prompts(rng, 3))]
    alone = run(make_scheduler(models, with_draft=False), arrivals)
    scheduler = make_scheduler(models, with_draft=True, steer_seed=21)
    assert scheduler.target.row_subsequences
    calls, target_run = [], scheduler.target.run

    def recorded(rows, *args, **kwargs):
        calls.append(list(rows))
        return target_run(rows, *args, **kwargs)

    monkeypatch.setattr(scheduler.target, "run", recorded)
    assert run(scheduler, arrivals, truths=alone) == alone
    prompt_len = {r.id: len(r.prompt) for r in scheduler.finished}
    decoding = [[r for r in rows if r.past_len >= prompt_len.get(r.seq_id, 1 << 30)] for rows in calls]
    assert all(r.num_rows == 1 for rows in decoding for r in rows), "a verification subsequence of several rows"
    widest = max(max(Counter(r.seq_id for r in rows).values(), default=0) for rows in decoding)
    assert widest == 6, f"no call verified a whole proposal of 5 tokens (at most {widest} rows of one request)"


def test_random_schedules_are_lossless_and_return_every_block(models):
    """Random arrivals, prompt lengths, budgets, EOS tokens and cache sizes that force requests to queue; the draft
    is steered so that accepted prefixes of every length and rejections at every position occur."""
    rng = np.random.default_rng(1234)
    accepted = 0
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
        alone = run(alone_scheduler, arrivals)
        spec_scheduler = make_scheduler(models, True, num_blocks, budget, int(rng.integers(3, 9)), steer_seed=trial)
        assert run(spec_scheduler, arrivals, truths=alone) == alone, f"trial {trial}"
        accepted += spec_scheduler.metrics.requests.num_accepted_tokens
        for scheduler in (alone_scheduler, spec_scheduler):
            allocator = scheduler.target.cache.allocator
            assert allocator.free_blocks == allocator.num_blocks and not allocator.tables
        draft_allocator = spec_scheduler.drafter.inner.model.cache.allocator
        assert draft_allocator.free_blocks == draft_allocator.num_blocks and not draft_allocator.tables
    assert accepted > 50, f"only {accepted} draft tokens accepted over 6 trials"


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


def test_metrics_count_what_the_draft_got_right(models):
    """Every counter against the steering log, which knows how many correct tokens led each proposal."""
    rng = np.random.default_rng(5)
    arrivals = [(0, p, GenerationConfig(max_new_tokens=40)) for p in prompts(rng, 4)]
    alone = run(make_scheduler(models, with_draft=False), arrivals)
    scheduler = make_scheduler(models, with_draft=True, steer_seed=5)
    run(scheduler, arrivals, truths=alone)
    log = scheduler.drafter.log
    totals = scheduler.metrics.requests
    assert totals.num_generated_tokens == sum(len(r.generated) for r in scheduler.finished) == 160
    steps = [s for per_request in log.steps.values() for s in per_request]
    assert totals.num_drafts == len(steps)
    assert totals.num_draft_tokens == sum(proposed for proposed, _ in steps)
    assert totals.num_accepted_tokens == sum(correct for _, correct in steps) > 0
    assert totals.accepted_histogram == log.histogram()
    longest = max(proposed for proposed, _ in steps)
    per_position = [sum(correct > i for _, correct in steps) for i in range(longest)]
    assert totals.accepted_per_position == per_position
    assert totals.mean_acceptance_length == pytest.approx(1 + totals.num_accepted_tokens / len(steps))
    for r in scheduler.finished:
        assert r.metrics.ttft is not None and r.metrics.ttft > 0
        assert sum(s["accepted"] for s in r.trace) == r.metrics.num_accepted_tokens
        assert [s["accepted"] for s in r.trace if s["proposed"]] == [c for _, c in log.steps[r.id]]


@pytest.mark.parametrize("kv", ["default", "u8"])
def test_default_runtime_options_are_exact(models, kv):
    """The pipeline defaults (f16 target cache, the target math chosen for this CPU, u8 draft cache), and a u8 target
    cache (keys per token), keep speculation lossless, with rolled-back rows written to the target cache on most
    steps. On a CPU with AVX-512 bf16 units and no AMX the math is bf16, where a k-row verification subsequence rounds
    otherwise than k decode steps: verification rows run as 1-row subsequences there."""
    from ovbuild.runtime.model.devices import target_inference_precision
    from ovbuild.runtime.pipeline import EXACT_TARGET, FAST_DRAFT

    target_model, draft_model = models
    rng = np.random.default_rng(99)
    # half the requests with the draft length chosen each step (the default), half pinned to the full block
    configs = [GenerationConfig(max_new_tokens=24, num_assistant_tokens=k) for k in (None, 3, 7)]
    arrivals = [(int(rng.integers(0, 3)), p, configs[i % 3]) for i, p in enumerate(prompts(rng, 12))]
    fast = dict(kv_cache_precision=FAST_DRAFT.kv_cache_precision, inference_precision=FAST_DRAFT.inference_precision)

    precision = EXACT_TARGET.kv_cache_precision if kv == "default" else kv

    math = target_inference_precision("CPU", EXACT_TARGET.inference_precision, precision)

    def scheduler(drafter):
        target = PagedModel(target_model, "CPU", precision, math)
        assert target.row_subsequences
        return Scheduler(target, drafter, speculation=fixed_speculation(drafter))

    alone = run(scheduler(None), arrivals)
    steered = scheduler(SteeredDrafter(BlockDrafter(draft_model, **fast), VOCAB, seed=99))
    assert run(steered, arrivals, truths=alone) == alone
    assert_accepted(steered, 7, every_length=False)

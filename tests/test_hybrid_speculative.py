"""Speculative decoding on the tiny hybrid pair (Gated DeltaNet + full attention target, DFlash draft) is lossless:
the linear layers' states are kept from the last accepted row, through the same scheduler, with concurrent
requests, fixed and adaptive draft lengths, and a steered draft that makes every accepted-prefix length occur."""

from __future__ import annotations

import numpy as np
import pytest
from test_speculative import assert_accepted, prompts, run

from ovbuild.families import load_draft
from ovbuild.graph.dflash import build_dflash_draft
from ovbuild.graph.hybrid_target import build_hybrid_target
from ovbuild.reference.hybrid import HybridReference
from ovbuild.runtime.model.paged_model import PagedModel
from ovbuild.runtime.request import GenerationConfig
from ovbuild.runtime.scheduler import Scheduler
from ovbuild.runtime.speculation.drafters import BlockDrafter
from ovbuild.targets import load_target
from ovbuild.testing.planner import fixed_speculation
from ovbuild.testing.steered import SteeredDrafter
from ovbuild.testing.tiny_hybrid import TINY_HYBRID_TEXT, write_tiny_hybrid_dflash, write_tiny_hybrid_target
from ovbuild.weights.checkpoint import Checkpoint

F32 = dict(kv_cache_precision="f32")
VOCAB = TINY_HYBRID_TEXT["vocab_size"]


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    """(target config and weights, target IR with the draft's taps, draft IR), built once."""
    root = tmp_path_factory.mktemp("hybrid_pair")
    tcfg, tweights = load_target(Checkpoint.open(write_tiny_hybrid_target(root / "target")))
    dcfg, dweights = load_draft(Checkpoint.open(write_tiny_hybrid_dflash(root / "draft")))
    target_ir = build_hybrid_target(tcfg, tweights, dcfg.target_layer_ids)
    draft_ir = build_dflash_draft(dcfg, dweights, tweights)
    yield (tcfg, tweights), target_ir, draft_ir
    del dweights  # the IRs' constants share memory with the checkpoints' mapped files: they stay open until here


def make(hybrid, with_draft: bool, steer_seed: int | None = None, slots: int | None = None, budget: int = 48, **kv):
    _, target_ir, draft_ir = hybrid
    kv = kv or F32
    target = PagedModel(target_ir, num_blocks=64, state_slots=slots, **kv)
    drafter = BlockDrafter(draft_ir, num_blocks=64, **F32) if with_draft else None
    if drafter is not None and steer_seed is not None:
        drafter = SteeredDrafter(drafter, VOCAB, seed=steer_seed)
    speculation = fixed_speculation(drafter)  # plans independent of the load
    return Scheduler(target, drafter, max_num_batched_tokens=budget, trace=True, speculation=speculation)


def assert_released(scheduler: Scheduler) -> None:
    """Every KV block and state slot is back in its pool."""
    states, allocator = scheduler.target.states, scheduler.target.cache.allocator
    assert states.free_slots == states.num_slots and not states.slots
    assert allocator.free_blocks == allocator.num_blocks and not allocator.tables


def test_target_alone_matches_the_numpy_reference_greedy_decode(hybrid):
    """Three concurrent requests, prompts cut into chunks by a small batch budget, the state kept between calls by
    the pool: greedy tokens equal the reference's, which runs each sequence on its own."""
    (cfg, weights), _, _ = hybrid
    rng = np.random.default_rng(0)
    arrivals = [(s, p, GenerationConfig(max_new_tokens=10)) for s, p in enumerate(prompts(rng, 3))]
    scheduler = make(hybrid, with_draft=False, budget=16)
    generated = run(scheduler, arrivals)
    ref = HybridReference(cfg, weights)
    for (_, prompt, _), tokens in zip(arrivals, generated, strict=True):
        cache, feed, expected = ref.new_cache(), np.array(prompt), []
        for _ in range(10):
            logits, _ = ref.forward(cache, feed)
            expected.append(int(logits[-1].argmax()))
            feed = np.array(expected[-1:])
        assert tokens == expected
    assert_released(scheduler)


@pytest.mark.parametrize("k", [1, 3, 7, None])
def test_lossless_with_concurrent_requests(hybrid, k):
    """Five requests arriving over the first steps, the draft as it is and steered (fixed k: every accepted-prefix
    length 0..k occurs, so the kept state row varies over the whole verification)."""
    rng = np.random.default_rng(20 + (k or 0))
    config = GenerationConfig(max_new_tokens=int(rng.integers(20, 30)), num_assistant_tokens=k)
    arrivals = [(int(rng.integers(0, 4)), p, config) for p in prompts(rng, 5)]
    alone_scheduler = make(hybrid, with_draft=False)
    alone = run(alone_scheduler, arrivals)
    raw = make(hybrid, with_draft=True)
    assert run(raw, arrivals) == alone
    steered = make(hybrid, with_draft=True, steer_seed=k or 11)
    assert run(steered, arrivals, truths=alone) == alone
    if k is None:
        assert steered.metrics.requests.num_accepted_tokens > 0
    else:
        assert_accepted(steered, k)
    for scheduler in (alone_scheduler, raw, steered):
        assert_released(scheduler)


def test_random_schedules_with_few_state_slots_are_lossless(hybrid):
    """Random arrivals, lengths, EOS tokens and draft lengths, with fewer state slots than requests (they queue for
    a slot) and the draft steered to accept and reject at every position."""
    rng = np.random.default_rng(77)
    accepted = 0
    for trial in range(3):
        arrivals = []
        for prompt in prompts(rng, int(rng.integers(3, 6))):
            eos = tuple(int(t) for t in rng.integers(0, VOCAB, int(rng.integers(0, 3))))
            config = GenerationConfig(
                max_new_tokens=int(rng.integers(4, 24)), eos_token_ids=eos, num_assistant_tokens=int(rng.integers(0, 8))
            )
            arrivals.append((int(rng.integers(0, 5)), prompt, config))
        slots, budget = int(rng.integers(1, 3)), int(rng.integers(8, 40))
        alone = run(make(hybrid, False, slots=slots, budget=budget), arrivals)
        spec = make(hybrid, True, steer_seed=trial, slots=slots, budget=budget)
        # more requests than slots: admission waits for a slot (StatePool.allocate would raise otherwise)
        assert run(spec, arrivals, truths=alone) == alone, f"trial {trial}"
        accepted += spec.metrics.requests.num_accepted_tokens
        assert_released(spec)
    assert accepted > 20, f"only {accepted} draft tokens accepted over 3 trials"


def test_default_runtime_options_are_exact(hybrid):
    """The pipeline's target defaults (f16 KV cache on the full layers, f32 math for a target with states; the states
    are always f32)."""
    from ovbuild.runtime.model.devices import target_inference_precision
    from ovbuild.runtime.pipeline import EXACT_TARGET

    cache = EXACT_TARGET.kv_cache_precision
    math = target_inference_precision("CPU", EXACT_TARGET.inference_precision, cache, stateful=True)
    kv = dict(kv_cache_precision=cache, inference_precision=math)
    rng = np.random.default_rng(5)
    configs = [GenerationConfig(max_new_tokens=20, num_assistant_tokens=k) for k in (None, 7)]
    arrivals = [(0, p, configs[i % 2]) for i, p in enumerate(prompts(rng, 4))]
    alone = run(make(hybrid, False, **kv), arrivals)
    steered = make(hybrid, True, steer_seed=5, **kv)
    assert run(steered, arrivals, truths=alone) == alone
    assert_accepted(steered, 7, every_length=False)

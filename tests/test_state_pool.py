"""StatePool: no slot leaks, and after any mix of prefill chunks, verifications and rejections each sequence holds
exactly the state of the tokens it committed (checked against a replay from a new sequence, bit for bit)."""

from __future__ import annotations

import numpy as np
import pytest
from state_helpers import SPECS, RandomDrafter, ToyHybridTarget, replay, toy_call

from ovbuild.errors import CacheExhaustedError
from ovbuild.runtime.cache.cache_manager import BlocksAndSlots
from ovbuild.runtime.cache.kv_cache import BlockAllocator, SequenceRows
from ovbuild.runtime.cache.state_pool import StatePool
from ovbuild.runtime.request import GenerationConfig
from ovbuild.runtime.scheduler import Scheduler
from ovbuild.testing.steered import SteeredDrafter


def held(pool: StatePool, seq_id: int) -> dict[str, np.ndarray]:
    return {name: array[pool.slots[seq_id]] for name, array in pool.arrays.items()}


def assert_same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    for name in b:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def check_slots(pool: StatePool) -> None:
    taken = list(pool.slots.values())
    assert len(set(taken)) == len(taken), "a slot is given to two sequences"
    assert sorted(taken + pool._free) == list(range(pool.num_slots)), "a slot leaked or was duplicated"


@pytest.mark.parametrize("seed", range(8))
def test_random_alloc_calls_and_frees_keep_exact_states_and_leak_nothing(seed):
    """Random admissions, frees (finish or abort, also mid-prefill), and packed calls of random subsets where each
    sequence runs a prompt chunk or k + 1 verification rows and keeps the state of a random accepted row."""
    rng = np.random.default_rng(seed)
    pool = StatePool(SPECS, num_slots=int(rng.integers(1, 6)))
    committed: dict[int, list[int]] = {}  # seq -> tokens whose state the pool must hold
    next_id, calls = 0, 0
    for _ in range(200):
        op = rng.random()
        if op < 0.25:
            if pool.free_slots:
                pool.allocate(next_id)
                committed[next_id] = []
            else:
                with pytest.raises(CacheExhaustedError, match="needs a state slot"):
                    pool.allocate(next_id)
                assert not pool.has(next_id)
            next_id += 1
        elif op < 0.35 and committed:
            victim = int(rng.choice(list(committed)))
            pool.free(victim)
            del committed[victim]
        elif committed:
            seqs = [int(s) for s in rng.permutation(list(committed))[: int(rng.integers(1, len(committed) + 1))]]
            rows, ids, keep_rows, keeps = [], [], [], []
            for s in seqs:
                n = int(rng.integers(1, 9))
                rows.append(SequenceRows(s, len(committed[s]), n))
                ids.extend(rng.integers(0, 1000, n).tolist())
                prefill = rng.random() < 0.3
                keep_rows.append([n - 1] if prefill else list(range(n)))
                keeps.append(n - 1 if prefill else int(rng.integers(0, n)))  # row j: anchor + j accepted drafts
            before = {s: replay(committed[s]) for s in seqs}
            toy_call(pool, rows, ids, keep_rows)
            calls += 1
            begin = 0
            for s, r, keep in zip(seqs, rows, keeps, strict=True):
                if rng.random() < 0.1:  # the request finished with this call: freed before it keeps anything
                    pool.free(s)
                    del committed[s]
                else:
                    if committed[s]:  # a continuing sequence read its own slot, untouched by the call
                        assert_same(held(pool, s), before[s])
                    pool.keep(s, keep)
                    committed[s] += ids[begin : begin + keep + 1]
                    assert_same(held(pool, s), replay(committed[s]))
                begin += r.num_rows
        check_slots(pool)
        for s, tokens in committed.items():
            if tokens:
                assert_same(held(pool, s), replay(tokens))
    assert calls > 50
    for s in list(committed):
        pool.free(s)
    assert pool.free_slots == pool.num_slots and not pool.slots


def test_a_new_sequence_starts_from_zeros_whatever_its_slot_held():
    pool = StatePool(SPECS, num_slots=1)
    pool.allocate(0)
    toy_call(pool, [SequenceRows(0, 0, 5)], [1, 2, 3, 4, 5], None)
    pool.keep(0, 4)
    pool.free(0)
    pool.allocate(1)  # the same slot, still holding sequence 0's state
    toy_call(pool, [SequenceRows(1, 0, 2)], [7, 8], None)
    pool.keep(1, 1)
    assert_same(held(pool, 1), replay([7, 8]))


def test_misuse_is_refused_with_the_sequence_named():
    pool = StatePool(SPECS, num_slots=2)
    with pytest.raises(CacheExhaustedError, match="sequence 3 continues at 4 but has no state slot"):
        pool.inputs([SequenceRows(3, 4, 1)], None)
    pool.allocate(0)
    with pytest.raises(IndexError, match="state of row 2 asked, the call runs 2"):
        pool.inputs([SequenceRows(0, 0, 2)], [[2]])
    toy_call(pool, [SequenceRows(0, 0, 3)], [1, 2, 3], [[0, 2]])
    with pytest.raises(KeyError, match="no state after its row 1"):
        pool.keep(0, 1)
    pool.keep(0, 0)
    assert_same(held(pool, 0), replay([1]))


def test_a_hybrid_cache_admits_a_sequence_only_with_blocks_and_a_slot_and_frees_both():
    """BlocksAndSlots is what the scheduler reserves in a hybrid target: a refusal changes neither resource."""
    blocks, pool = BlockAllocator(4, 16), StatePool(SPECS, num_slots=1)
    cache = BlocksAndSlots(blocks, pool)
    assert cache.can_hold(0, 64) and not cache.can_hold(0, 65)
    with pytest.raises(CacheExhaustedError, match="sequence 0 needs 5 more cache blocks"):
        cache.reserve(0, 65)
    assert blocks.free_blocks == 4 and pool.free_slots == 1
    cache.reserve(0, 16)
    assert blocks.free_blocks == 3 and pool.has(0)
    cache.reserve(0, 32)  # growing a sequence needs no second slot
    assert blocks.free_blocks == 2 and pool.free_slots == 0
    assert not cache.can_hold(1, 16)  # blocks are free, no slot is
    with pytest.raises(CacheExhaustedError, match="sequence 1 needs a state slot"):
        cache.reserve(1, 16)
    assert blocks.free_blocks == 2 and not pool.has(1)
    cache.free(0)
    assert blocks.free_blocks == 4 and pool.free_slots == 1 and cache.can_hold(1, 64)


def run_toy(drafter, arrivals, slots: int, truths=None, check_every_step: bool = True):
    """Scheduler on the toy hybrid target; after every step each running request's slot must hold the state of
    exactly the tokens in its target cache. Returns (generated per arrival, scheduler)."""
    target = ToyHybridTarget(slots=slots)
    scheduler = Scheduler(target, drafter, max_num_batched_tokens=int(arrivals[0][2].max_new_tokens) + 8)
    pending, requests, step = list(enumerate(arrivals)), {}, 0
    while pending or scheduler.has_unfinished():
        while pending and pending[0][1][0] <= step:
            index, (_, prompt, config) = pending.pop(0)
            requests[index] = scheduler.add_request(prompt, config)
            if truths is not None:
                drafter.truths[requests[index].id] = [*prompt, *truths[index]]
        scheduler.step()
        assert len(scheduler.running) <= slots
        for r in scheduler.running:
            if check_every_step and r.target_len:
                cached = [*r.prompt.tolist(), *r.generated][: r.target_len]
                assert_same(held(target.states, r.id), replay(cached))
        step += 1
    assert target.states.free_slots == slots and not target.states.slots
    assert target.cache.allocator.free_blocks == target.cache.allocator.num_blocks
    return [requests[i].generated for i in range(len(arrivals))], scheduler


@pytest.mark.parametrize("k", [None, 1, 4, 7])
def test_scheduler_keeps_the_last_accepted_row_and_stays_lossless(k):
    """Concurrent requests, more than the pool has slots (they queue), prompt chunks split across steps; the steered
    draft makes every accepted-prefix length occur, so the kept row varies from 0 to k."""
    rng = np.random.default_rng(7 if k is None else k)
    arrivals = []
    for _ in range(6):
        config = GenerationConfig(max_new_tokens=int(rng.integers(12, 30)), num_assistant_tokens=k)
        arrivals.append((int(rng.integers(0, 4)), rng.integers(0, 97, int(rng.integers(2, 40))).tolist(), config))
    arrivals.sort(key=lambda a: a[0])
    alone, _ = run_toy(None, arrivals, slots=3)
    steered = SteeredDrafter(RandomDrafter(), 97, seed=3)
    spec, scheduler = run_toy(steered, arrivals, slots=3, truths=alone)
    assert spec == alone
    raw, _ = run_toy(RandomDrafter(1), arrivals, slots=2)
    assert raw == alone
    if k is not None:
        histogram = scheduler.metrics.requests.accepted_histogram
        assert len(histogram) == k + 1 and all(histogram), f"accepted-prefix lengths 0..{k} not all seen: {histogram}"
    else:
        assert scheduler.metrics.requests.num_accepted_tokens > 0

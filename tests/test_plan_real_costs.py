"""Plans at the call costs of a Qwen3-4B-shaped pair measured on an AVX2-only CPU: the draft length of most tokens per
second, for one request and jointly for a batch; a request that misses kept out of everyone's verification; and
drafting that stops when it loses and comes back when acceptance recovers or the evidence of the misses fades."""

from __future__ import annotations

import itertools

import numpy as np

from ovbuild.runtime.speculation.acceptance import IDLE_DECAY, AcceptanceStats
from ovbuild.runtime.speculation.planner import Speculation
from ovbuild.testing.planner import accepting, fixed_cost, fixed_curve

# Measured on a 2-core AVX2-only EPYC (docs/speed.md): a Qwen3-4B-shaped target with int8 weights, compute-bound from
# a few rows on, and its z-lab-shaped draft (seconds by rows). Between the rows given, costs are linear.
AVX2_TARGET = {1: 0.400, 4: 0.594, 8: 0.725, 12: 0.912, 16: 1.090, 24: 1.5}
AVX2_DRAFT = {1: 0.030, 6: 0.061, 16: 0.260, 24: 0.380}


def known(rates: list[float], weight: float = 1e9) -> AcceptanceStats:
    """A request (or run) that accepted position j at rates[j], seen so often that the estimate is rates[j]."""
    return accepting(rates, weight)


def exact_planner(positions: int, target: dict, draft: dict) -> Speculation:
    """A planner with fixed cost curves, no host time, and a run-wide record so heavy that its estimates carry
    no optimism: what it plans is the best plan of the formula, nothing else."""
    spec = Speculation(positions, 1, fixed_curve(target), fixed_curve(draft), learn_host=False)
    spec.run = known([0.5] * positions)
    return spec


def test_the_plan_takes_the_draft_length_of_most_tokens_per_second():
    """One request, acceptance a = 0.831 at every position (tau 5.6 over a block of 16), the AVX2 CPU's curves. By
    hand, tokens(k) = 1 + a + ... + a^k over T(k + 1) + D(k + 1) seconds (the draft runs a block of k + 1 rows):
    k = 6: 4.298 tokens in 0.725 + 0.048 = 0.773 s = 5.56 tokens/s; k = 7: 4.572 in 0.826 s = 5.54; k = 15: 5.611 in
    1.090 + 0.260 = 1.350 s = 4.16; k = 0: 1 in 0.4 s = 2.5. The planner must take k = 6, not the full block."""
    a = 0.831
    spec = exact_planner(15, AVX2_TARGET, AVX2_DRAFT)
    spec.run = known([a] * 15)
    (k,) = spec.plan([(known([a] * 15), 15)], 1, 0, 0, False)

    def rate(k: int) -> float:  # the formula above, written out
        tokens = sum(a**j for j in range(k + 1))
        target = np.interp(k + 1, list(AVX2_TARGET), list(AVX2_TARGET.values()))
        draft = np.interp(k + 1, list(AVX2_DRAFT), list(AVX2_DRAFT.values())) if k else 0.0
        return float(tokens / (target + draft))

    assert [round(rate(k), 2) for k in (0, 6, 7, 15)] == [2.5, 5.56, 5.54, 4.16]
    assert k == 6, f"planned k = {k} ({rate(k):.3f} tokens/s), best k = 6 ({rate(6):.3f})"


def batch_rate(rates: list[float], ks: tuple[int, ...], target: dict, draft: dict) -> float:
    """Modelled tokens per second of one step where request i, accepting each position at rates[i], drafts ks[i]:
    one verification call of every request's 1 + k rows, one draft call of every drafting request's k + 1 rows."""
    tokens = sum(sum(a**j for j in range(k + 1)) for a, k in zip(rates, ks, strict=True))
    seconds = np.interp(sum(1 + k for k in ks), list(target), list(target.values()))
    if any(ks):
        seconds += np.interp(sum(k + 1 for k in ks if k), list(draft), list(draft.values()))
    return float(tokens / seconds)


def test_a_batch_plan_is_the_best_joint_plan():
    """Four requests at once, each request's k chosen jointly: drafting for one costs all of them a wider
    verification. The plan's modelled speed is the best over every combination of k = 0..5 per request, brute force
    written out here (batch_rate), within 1% (the planner's order ignores that a request's first proposal costs one
    more draft row)."""
    rates = [0.831, 0.9, 0.6, 0.831]
    spec = exact_planner(5, AVX2_TARGET, AVX2_DRAFT)
    chosen = spec.plan([(known([a] * 5), 5) for a in rates], 4, 0, 0, False)
    best = max(itertools.product(range(6), repeat=4), key=lambda ks: batch_rate(rates, ks, AVX2_TARGET, AVX2_DRAFT))
    got, top = (batch_rate(rates, tuple(ks), AVX2_TARGET, AVX2_DRAFT) for ks in (chosen, best))
    assert got >= 0.99 * top, f"planned {chosen}: {got:.3f} tokens/s, best {best}: {top:.3f}"
    assert got > 1.05 * batch_rate(rates, (0, 0, 0, 0), AVX2_TARGET, AVX2_DRAFT)


def test_a_request_that_misses_does_not_widen_everyones_verification():
    """Two requests, one whose draft is right 90% of the time and one right 10%: every verification row costs the
    whole batch (a compute-bound target: 40 ms a row over 0.4 s a call). By hand, the second request's first proposal
    brings 0.1 tokens for 40 ms more of a step of about 1 s with 7 tokens in it (7 tokens/s): 2.5 tokens/s at the
    margin, less than the step's own rate, so it drafts 0, while the first drafts; with both at 10% nobody drafts
    (and there is no draft call)."""
    target = {1: 0.4, 2: 0.44, 4: 0.52, 8: 0.68, 16: 1.0, 24: 1.32}
    draft = {1: 0.01, 16: 0.04, 24: 0.06}
    spec = exact_planner(7, target, draft)
    good, poor = known([0.9] * 7), known([0.1] * 7)
    ks = spec.plan([(good, 7), (poor, 7)], 2, 0, 0, False)
    assert ks[0] > 0 and ks[1] == 0, ks
    best = max(itertools.product(range(8), repeat=2), key=lambda k: batch_rate([0.9, 0.1], k, target, draft))
    assert best[1] == 0 and tuple(ks) == best, (ks, best)
    assert spec.plan([(poor, 7), (poor, 7)], 2, 0, 0, False) == [0, 0]


def test_drafting_stops_when_it_loses_and_comes_back_when_acceptance_recovers():
    """A request whose draft is wrong at every proposal for 60 steps, then right at every one: the planner stops
    drafting (after a few tries while the evidence is thin), and once the draft is right again it drafts again
    within 120 steps, though it learns acceptance only from the steps it drafts in: its own record and the run's fade
    while nobody drafts (IDLE_DECAY, RUN_IDLE_DECAY), back towards an optimistic prior, until a plan tries again.
    Costs: the AVX2 CPU's (drafting 6 at 0.831 is 2.2x not drafting)."""
    spec = exact_planner(15, AVX2_TARGET, AVX2_DRAFT)
    spec.run = spec.run.empty(15)  # nothing seen yet: the prior
    request = spec.new_stats()
    drafted = []
    for step in range(300):
        right = step >= 60
        request.settle(IDLE_DECAY)
        (k,) = spec.plan([(request, 15)], 1, 0, 0, False)
        if k:
            spec.record(request, k, k if right else 0)
        else:
            request.idle_steps += 1
            spec.age(1)
        drafted.append(k)
    wrong, right = drafted[:60], drafted[60:]
    # tried while the evidence is thin, then rarely: a retry now and then is what lets it find out (bounded: 3 steps)
    assert sum(map(bool, wrong[:10])) >= 1 and sum(map(bool, wrong[10:])) <= 3, f"while wrong it drafted {wrong}"
    back = next((i for i, k in enumerate(right) if k), None)
    print(f"drafted while wrong: {wrong}; after: {right}")
    assert back is not None and back < 120, f"after the draft was right again it drafted first at step {back}"
    assert all(k >= 4 for k in right[back + 10 :]), f"once back, it kept drafting: {right[back:]}"


def test_the_run_wide_evidence_fades_while_nobody_drafts():
    """A run whose first verifications all missed stops drafting; steps in which nobody drafts fade that evidence
    back towards the prior, so the planner tries again (the draft's misses may have been a bad moment), and the
    realism's counts fade alike."""
    spec = Speculation(7, 1, fixed_cost(2.8e-3, 3e-5), fixed_cost(1.4e-3, 1e-5), host_s=5e-4, learn_host=False)
    misses = 0
    while misses < 40 and (k := spec.plan([(fresh := spec.new_stats(), 7)], 1, 0, 0, False)[0]):
        spec.record(fresh, k, 0)  # every proposal rejected at its first token
        misses += 1
    assert k == 0 and misses > 0, "the planner kept drafting a draft that never hit"
    expected, accepted = spec.expected_tokens, spec.accepted_tokens
    spec.age(1)
    assert spec.plan([(spec.new_stats(), 7)], 1, 0, 0, False) == [0], "one idle step is not a reason to try again"
    spec.age(1000)
    assert spec.plan([(spec.new_stats(), 7)], 1, 0, 0, False)[0] > 0
    assert spec.expected_tokens < 0.1 * expected and spec.accepted_tokens <= accepted

"""The exploration budget: a plan that tries drafting against the evidence is taken only while the credit covers what
it expects to lose, its outcome settles the credit, and over a run where no draft length pays the tries lose at most
the budget's share of the time."""

from __future__ import annotations

import math
import random

import pytest
from test_planner_statistics import idle_step, planner

from ovbuild.runtime.speculation import exploration
from ovbuild.runtime.speculation.acceptance import IDLE_DECAY
from ovbuild.runtime.speculation.exploration import CREDIT_STEPS, EXPLORATION_SHARE, ExplorationBudget
from ovbuild.runtime.speculation.planner import Speculation
from ovbuild.testing.planner import fixed_curve

# Priced calls of a Qwen3-4B-shaped pair with 4 requests at once under AVX2 kernels (int8 weights, f32 math; seconds
# by rows, bench_real_scale.py): a 32-row verify takes 6.3 times a 4-row one, and no draft length pays at 0.9.
TARGET_AVX2 = {1: 0.205, 2: 0.218, 4: 0.281, 6: 0.558, 8: 0.605, 12: 0.781, 16: 0.937, 24: 1.407, 32: 1.773}
DRAFT_AVX2 = {1: 0.003, 2: 0.018, 4: 0.041, 6: 0.059, 8: 0.080, 12: 0.128, 16: 0.161, 24: 0.214, 32: 0.247}
HOST_S, DRAFT_HOST_S = 1e-3, 7e-4


def test_a_plan_is_taken_only_while_the_credit_covers_its_expected_loss():
    """Of plans 0..3 (rates and expected losses given), the best rate whose loss the credit covers: a plan that pays
    as expected (a loss under 0) always may; the credit is capped at CREDIT_STEPS plain steps."""
    budget = ExplorationBudget(credit=0.5)
    rates, losses = [1.0, 1.1, 1.3, 1.2], [0.0, -0.2, 0.8, 0.4]
    assert budget.best(rates, losses, step_s=1.0) == 3  # plan 2 would lose 0.8 s, the credit is 0.5 s
    assert budget.best(rates, [0.0, -0.2, 0.8, 0.9], step_s=1.0) == 1
    budget.credit = 100.0
    assert budget.best(rates, losses, step_s=0.1) == 1 and budget.credit == pytest.approx(CREDIT_STEPS * 0.1)
    budget.credit = -1.0  # overspent: no try, a plan that pays still
    assert budget.best(rates, [0.0, 0.0, 0.1, 0.1], step_s=1.0) == 1


def test_an_explorations_outcome_settles_the_credit_at_its_real_loss():
    """A try expected to lose 0.3 s at 0.1 s a token, expecting 2 tokens (realism 1.5: 3 counted): accepting 5 gains
    back the 2 tokens beyond, accepting 1 costs the 2 short; a plan that pays as expected neither spends nor settles."""
    for accepted, credit in ((5, 1.0 - 0.3 + 0.2), (1, 1.0 - 0.3 - 0.2)):
        budget = ExplorationBudget(credit=1.0)
        budget.spend(0.3, token_s=0.1, realism=1.5)
        budget.settle(accepted, expected=2.0)
        assert budget.credit == pytest.approx(credit)
    budget = ExplorationBudget(credit=1.0)
    budget.spend(-0.3, token_s=0.1, realism=1.0)
    budget.settle(0, expected=2.0)
    assert budget.credit == 1.0
    budget.earn(10, 0.5)
    assert budget.credit == pytest.approx(1.0 + EXPLORATION_SHARE * 10 * 0.5)


def lost_share(acceptance: float, requests: int, steps: int, seed: int) -> float:
    """The planner on the AVX2 curve for `steps` steps of `requests` requests whose draft is accepted at
    `acceptance` a position (seeded): the share of its priced time lost against never drafting."""
    rng = random.Random(seed)
    spec = Speculation(15, 1, fixed_curve(TARGET_AVX2), fixed_curve(DRAFT_AVX2), host_s=HOST_S, learn_host=False)
    spec.draft_host_s = DRAFT_HOST_S
    stats = [spec.new_stats() for _ in range(requests)]
    tokens, seconds = 0, 0.0
    for _ in range(steps):
        lengths = spec.plan([(s, 15) for s in stats], requests, 0, 0, False)
        seconds += spec.target_cost.prices([requests + sum(lengths)])[0] + HOST_S
        if any(lengths):
            seconds += spec.draft_cost.prices([sum(k + 1 for k in lengths if k)])[0] + DRAFT_HOST_S
        for s, k in zip(stats, lengths, strict=True):
            accepted = 0
            while accepted < k and rng.random() < acceptance:
                accepted += 1
            spec.record(s, k, accepted)
            tokens += 1 + accepted
        if not any(lengths):
            spec.age(1)
            for s in stats:
                s.idle_steps += 1
                s.settle(IDLE_DECAY)
    plain_s = (spec.target_cost.prices([requests])[0] + HOST_S) / requests  # a token's time, never drafting
    return 1.0 - tokens * plain_s / seconds


def test_where_no_draft_length_pays_the_tries_lose_at_most_the_budget(monkeypatch):
    """4 requests on the AVX2 curve at 0.9 a position over 512 steps: drafting loses at every length, and the plans'
    tries lose at most EXPLORATION_SHARE of the time plus the CREDIT_STEPS saved at the start; with a credit that never
    runs out (the optimism alone deciding, as before the budget) they lose more than that bound."""
    steps = 512
    bound = EXPLORATION_SHARE + CREDIT_STEPS / steps
    budgeted = [lost_share(0.9, 4, steps, seed) for seed in range(3)]
    monkeypatch.setattr(exploration, "CREDIT_STEPS", math.inf)
    unbudgeted = [lost_share(0.9, 4, steps, seed) for seed in range(3)]
    assert max(budgeted) <= bound, f"lost {budgeted} of the time, the budget allows {bound:.3f}"
    assert min(unbudgeted) > bound, f"without the budget the tries lost only {unbudgeted}"


def test_the_budget_leaves_a_draft_that_pays_alone():
    """One request on the same curve at 0.83 a position, where drafting 3 pays about 1.9x: the budget takes nothing
    from it (the plans pay as expected), so no time is lost and well over a third is gained."""
    assert lost_share(0.83, 1, 256, seed=0) < -0.4


def test_idle_steps_earn_what_a_try_needs():
    """A run's first verification missed for three of its four requests (the unlucky record of
    test_planner_statistics, where drafting 2 each pays 1.25x): with the credit left, the plans try again once the
    exploration bonus has grown (52 idle steps); with the credit spent, only once the idle steps have earned the try's
    expected loss back, later but within 200 steps."""

    def idle_until_a_try(credit: float | None) -> int:
        spec = planner()
        requests = [spec.new_stats() for _ in range(4)]
        first = spec.plan([(r, 15) for r in requests], 4, 0, 0, False)
        for request, accepted in zip(requests, (0, 0, 1, 0), strict=True):
            spec.record(request, first[0], accepted)
        if credit is not None:
            spec.budget.credit = credit
        idle = 0
        while idle < 200 and not any(spec.plan([(r, 15) for r in requests], 4, 0, 0, False)):
            idle += 1
            idle_step(spec, requests)
        return idle

    left, spent = idle_until_a_try(None), idle_until_a_try(0.0)
    assert left < spent < 200, (left, spent)

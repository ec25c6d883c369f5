"""The planner's statistics: how far a request's own record counts against the run's (empirical Bayes), how thin
evidence is tried again while nobody drafts (UCB-like exploration), how plans back off while nobody drafts, and host
times kept as medians."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ovbuild.runtime.speculation.acceptance import (
    IDLE_DECAY,
    MAX_REQUEST_WEIGHT,
    PRIOR_WEIGHT,
    REQUEST_WEIGHT,
    AcceptanceStats,
    pooled,
    with_bonus,
)
from ovbuild.runtime.speculation.acceptance import request_weight as weight_of_counts
from ovbuild.runtime.speculation.pace import MAX_PATIENCE, MAX_PLAN_BACKOFF, PLAN_SHARE, RETRY_PLANS
from ovbuild.runtime.speculation.planner import RUN_IDLE_DECAY, Speculation
from ovbuild.testing.planner import fixed_cost, fixed_curve

# Timed calls of a Qwen3-4B-shaped pair with 4 requests at once (int8 weights, f32 math, 2-core AVX-512 EPYC):
# seconds by rows. Drafting 2 for each of 4 requests at 0.83 acceptance ran 1.25x not drafting there.
TARGET_4 = {4: 0.106, 8: 0.148, 12: 0.173, 16: 0.226, 24: 0.236, 32: 0.329, 48: 0.444, 64: 0.592}
DRAFT_4 = {6: 0.024, 8: 0.028, 16: 0.036, 24: 0.040, 32: 0.054, 48: 0.075, 64: 0.077}
# the same pair, one request at a time
TARGET_1 = {1: 0.100, 3: 0.102, 6: 0.116, 8: 0.151, 12: 0.185, 16: 0.219, 32: 0.327}
DRAFT_1 = {4: 0.024, 6: 0.024, 8: 0.028, 12: 0.031, 16: 0.041, 24: 0.048}


def request_weight(stats: list[AcceptanceStats]) -> float:
    """The request weight of these requests' records, all positions pooled."""
    return weight_of_counts([pooled(s) for s in stats])


def counted(accepted: list[float], reached: list[float]) -> AcceptanceStats:
    """A request's record: per position, verifications that reached it and those that accepted it."""
    return AcceptanceStats(np.array(reached, float), np.array(accepted, float))


def idle_step(spec: Speculation, requests: list[AcceptanceStats]) -> None:
    """A step in which nobody drafted, as the scheduler accounts it: the run ages, each request's record fades."""
    spec.age(1)
    for request in requests:
        request.idle_steps += 1
        request.settle(IDLE_DECAY)


def planner(positions: int = 15) -> Speculation:
    spec = Speculation(positions, 1, fixed_curve(TARGET_4), fixed_curve(DRAFT_4), learn_host=False)
    spec.host_s, spec.draft_host_s = 2.4e-4, 7e-4
    return spec


def test_requests_that_accept_alike_lean_on_the_run_and_unlike_ones_on_themselves():
    """The run-wide estimate's weight in a request's own follows the spread between the requests: counts that differ
    no more than chance makes give the most weight, requests that plainly differ the least, one request the floor."""
    alike = [counted([9, 8], [10, 9]), counted([8, 7], [10, 8]), counted([9, 8], [10, 9]), counted([10, 9], [10, 10])]
    assert request_weight(alike) == MAX_REQUEST_WEIGHT
    unlike = [counted([60, 55], [60, 60]), counted([18, 6], [60, 18])]  # about 0.95 and 0.3 a position
    assert request_weight(unlike) == REQUEST_WEIGHT
    some = [counted([9, 8], [10, 9]), counted([7, 5], [10, 7]), counted([9, 9], [10, 9])]  # 0.9, 0.7, 0.95
    assert REQUEST_WEIGHT < request_weight(some) < MAX_REQUEST_WEIGHT
    assert request_weight([alike[0]]) == REQUEST_WEIGHT
    assert request_weight([AcceptanceStats.empty(2)] * 3) == REQUEST_WEIGHT  # nothing seen yet


def test_a_lucky_request_among_alike_ones_is_not_given_a_longer_draft():
    """Four requests at one acceptance: the one whose recent verifications all hit gets about the others' draft
    length, not a much longer one (weighed at REQUEST_WEIGHT whatever the spread, it got 12 against the others' 2
    and 3)."""
    spec = planner()
    spec.run.reached[:], spec.run.accepted[:] = 400.0, 360.0  # the run: 0.9 a position
    usual = counted([9.0] * 15, [10] * 15)
    lucky = counted([10.0] * 15, [10] * 15)
    lengths = spec.plan([(lucky, 15), (usual, 15), (usual, 15), (usual, 15)], 4, 0, 0, False)
    assert min(lengths[1:]) > 0 and lengths[0] <= max(lengths[1:]) + 1, lengths


def test_one_request_at_a_time_is_weighed_by_how_its_predecessors_differed():
    """Alone in its plans, a request's lucky streak is weighed against the requests that finished before it: where
    they accepted alike it drafts about what the run's estimate says, where they differed widely its own record
    leads as before (REQUEST_WEIGHT)."""
    lucky = counted([10.0] * 15, [10] * 15)

    def plan_after(predecessors: list[tuple[float, float]]) -> int:
        spec = Speculation(15, 1, fixed_curve(TARGET_1), fixed_curve(DRAFT_1), learn_host=False)
        spec.run.reached[:], spec.run.accepted[:] = 400.0, 332.0  # the run: 0.83 a position
        for accepted, reached in predecessors:
            spec.retire(counted([accepted / 15] * 15, [reached / 15] * 15))
        return spec.plan([(lucky, 15)], 1, 0, 0, False)[0]

    alike = plan_after([(249.0, 300.0)] * 6)  # 0.83 each
    unlike = plan_after([(285.0, 300.0), (90.0, 300.0)] * 3)  # 0.95 and 0.3
    assert alike <= 8 and unlike >= 12, (alike, unlike)  # the run's 0.83 a position against its own 10 of 10


def test_one_unlucky_verification_is_tried_again_within_a_few_steps():
    """A run's first verification missed early for two of its four requests (acceptance 0.83 a position, where
    drafting 2 each pays 1.25x): the plans stop drafting, and while nobody drafts the standard errors taken grow
    (OPTIMISM, since_drafted) so that a plan drafts again within 100 steps; fading alone took 343."""
    spec = planner()
    requests = [spec.new_stats() for _ in range(4)]
    first = spec.plan([(r, 15) for r in requests], 4, 0, 0, False)
    assert all(first), first
    for request, accepted in zip(requests, (0, 0, 1, 0), strict=True):
        spec.record(request, first[0], accepted)
    idle = 0
    while idle < 100 and not any(spec.plan([(r, 15) for r in requests], 4, 0, 0, False)):
        idle += 1
        idle_step(spec, requests)
    assert any(spec.plan([(r, 15) for r in requests], 4, 0, 0, False)), "no plan drafted again within 100 steps"
    assert idle > 4, f"it drafted again after {idle} steps: the misses were hardly weighed"


def test_a_draft_seen_poor_many_times_is_not_tried_again_soon():
    """The same growth leaves a draft alone whose misses are many: 40 verifications missed at their first token, and
    no plan drafts over the next 100 idle steps."""
    spec = planner()
    request = spec.new_stats()
    for _ in range(40):
        spec.record(request, 4, 0)
    for _ in range(100):
        idle_step(spec, [request])
        assert spec.plan([(request, 15)] * 4, 4, 0, 0, False) == [0, 0, 0, 0]


def test_one_slow_drafting_step_does_not_price_every_later_plan():
    """Host time is the median of the recent steps: one drafting step of 16 ms among steps of 1 ms (a garbage
    collection, a first call's allocations) is not charged to the plans after the next drafting step."""
    spec = Speculation(15, 1, fixed_curve(TARGET_4), fixed_curve(DRAFT_4))
    for _ in range(5):
        spec.observe_host(2.4e-4, drafted=False, requests=4)
    spec.observe_host(1.6e-2, drafted=True, requests=4)
    assert spec.host_costs(4)[1] > 1e-2  # one step is all it knows
    spec.observe_host(1.0e-3, drafted=True, requests=4)
    assert spec.host_costs(4)[1] < 1e-3


def test_a_retry_that_fails_resumes_the_backoff_where_it_stood():
    """Plans for nobody back off 1, 2, 4, ... up to MAX_PLAN_BACKOFF steps; a retry (at most RETRY_PLANS drafting
    plans) that ends resumes at the backoff it began at, not from 1; drafting that took hold (a longer streak) backs
    off from 1 again when it stops."""
    spec = planner()
    steps = [spec.back_off(False) for _ in range(7)]
    assert steps == [1, 2, 4, 8, 16, 32, 32] and MAX_PLAN_BACKOFF == 32
    for _ in range(RETRY_PLANS):
        assert spec.back_off(True) == 0, "a plan that drafts is followed by a plan next step"
    assert spec.back_off(False) == MAX_PLAN_BACKOFF, "the retry ended: back to every 32nd step at once"
    for _ in range(RETRY_PLANS + 1):
        spec.back_off(True)
    assert spec.back_off(False) == 1, "drafting took hold, then stopped: plans back off from 1 again"


def test_plans_dear_next_to_their_steps_come_further_apart():
    """Where a plan costs more than PLAN_SHARE of the plain steps between two plans (a fast target, many requests), the
    backoff goes on doubling past MAX_PLAN_BACKOFF to the steps that keep it within that share, up to
    MAX_PLAN_BACKOFF * MAX_PATIENCE; a plan that cheap next to its steps keeps MAX_PLAN_BACKOFF."""
    spec = planner()
    spec.plan_s, spec.plain_step_s = 1e-3, 1e-3  # a plan as long as a step: 1 / PLAN_SHARE = 200 steps apart
    steps = [spec.back_off(False) for _ in range(10)]
    assert steps == [1, 2, 4, 8, 16, 32, 64, 128, 200, 200] and PLAN_SHARE == 0.005
    spec.plan_s = 1e-2  # 2000 steps apart would keep the share: capped
    assert spec.back_off(False) == MAX_PLAN_BACKOFF * MAX_PATIENCE
    spec.plan_s = 1e-5
    assert spec.back_off(False) == MAX_PLAN_BACKOFF


def test_failed_retries_make_the_run_wide_evidence_fade_more_slowly():
    """Each retry that fails doubles the half-life over which the run's evidence fades while nobody drafts (up to
    MAX_PATIENCE times), so a pair where drafting keeps losing is retried ever more rarely; drafting that takes hold
    restores the base pace. Expected: the fade over 100 idle steps is RUN_IDLE_DECAY ** (100 / patience)."""
    spec = planner()
    for _ in range(6):
        spec.back_off(False)  # backed off all the way
    patience = []
    for _ in range(5):
        spec.back_off(True)  # a retry of one plan, which fails
        spec.back_off(False)
        patience.append(spec.pace.patience)
    assert patience == [2, 4, 8, 8, 8] and MAX_PATIENCE == 8
    spec.run.reached[:] = 10.0
    spec.age(100)
    assert spec.run.reached[0] == 10.0 * RUN_IDLE_DECAY ** (100 / 8)
    for _ in range(RETRY_PLANS + 1):
        spec.back_off(True)
    assert spec.pace.patience == 1, "drafting took hold"


def test_the_bonus_on_a_block_adds_up_as_its_positions_errors_do():
    """The exploration bonus on a block's survival: at the first position, p plus that many standard errors; along a
    block whose deep positions were never reached (their estimates are the first's, carried down the chain), each
    position's bonus multiplied in; along a block whose every position was seen 400 times (independent errors), the
    bonus on log s_15 about sqrt(15) times one position's, not 15 times."""
    p, bonus = 0.9, 1.0

    def lift(reached: list[float]) -> list[float]:
        chances = with_bonus([p] * 15, reached, bonus)
        return [s / p ** (j + 1) for j, s in enumerate(np.cumprod(chances))]  # s_j over its estimate

    seen = 400 + PRIOR_WEIGHT
    one = bonus * math.sqrt((1 - p) / (p * seen))  # a position's bonus, relative to p
    thick = lift([400.0] * 15)
    assert thick[0] * p == pytest.approx(p + bonus * math.sqrt(p * (1 - p) / seen), rel=1e-12)
    assert math.log(thick[14]) == pytest.approx(math.sqrt(15) * math.log1p(one), rel=0.02)
    assert thick[14] < (1 + one) ** 15 / 1.15  # 1.07 against 1.28 multiplied along the block
    thin = lift([400.0] + [0.0] * 14)
    assert thin == pytest.approx([(1 + one) ** (j + 1) for j in range(15)], rel=1e-12)


def test_a_position_plans_stopped_reaching_keeps_the_error_of_its_own_count():
    """Plans that draft 1 reach the first position only: 600 verifications there, 20 at the second, long ago. The
    second position's bonus is that of its own 20 (its estimate mixes them with the first's at 2 observations), not
    the first's 600: log(s_2's upper bound / its estimate) is at least log(1 + sd / p_2), sd the standard deviation
    of 20 binomial draws among 22."""
    p_1, p_2, bonus = 0.8, 0.3, 1.0
    chances = with_bonus([p_1, p_2] + [p_2] * 13, [600.0, 20.0] + [0.0] * 13, bonus)
    own = math.sqrt(20 * p_2 * (1 - p_2)) / (20 + PRIOR_WEIGHT)
    lift = chances[0] * chances[1] / (p_1 * p_2)
    assert math.log(lift) >= math.log1p(bonus * own / p_2), (lift, own)
    first = math.sqrt(p_2 * (1 - p_2) / (600 + PRIOR_WEIGHT))  # at the first position's count: 1.13, where this is 1.31
    assert lift > (1 + bonus * first / p_2) ** 2 * 1.1


def test_the_run_record_of_a_position_plans_stopped_reaching_fades_while_they_draft():
    """Plans draft 1 against a second position seen poor long ago (12 of 60 accepted), where it now accepts as often
    as the first (0.8), and drafting 3 would run 1.27x drafting 1 at these costs. The run's record fades with every
    step that verifies (RUN_DECAY), so the old misses lose their weight and a plan drafts 2 or more within 300 steps;
    with the record kept whole, none did in 400."""
    rng = np.random.default_rng(0)
    spec = Speculation(15, 1, fixed_cost(2e-3, 5e-4), fixed_cost(5e-4, 5e-5), learn_host=False)
    spec.host_s, spec.draft_host_s = 1e-4, 1e-4
    spec.run.reached[:2], spec.run.accepted[:2] = (300.0, 60.0), (240.0, 12.0)
    request = spec.new_stats()
    lengths = []
    while len(lengths) < 300 and (not lengths or lengths[-1] < 2):
        (k,) = spec.plan([(request, 15)], 1, 0, 0, False)
        lengths.append(k)
        if k:
            accepted = next((j for j in range(k) if rng.random() >= 0.8), k)
            spec.record(request, k, accepted)
        else:
            idle_step(spec, [request])
    assert lengths[0] < 2, f"the stale record did not hold the first plan back: {lengths[0]}"
    assert lengths[-1] >= 2, f"no plan drafted 2 or more in {len(lengths)} steps ({lengths.count(1)} drafted 1)"

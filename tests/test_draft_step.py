"""The draft side of a step: the DraftPlanner's plans (made from requests alone, no model) and the step plan's draft
lengths, which must be the proposals each request's verification rows carry."""

from __future__ import annotations

import numpy as np

from ovbuild.runtime.draft_step import DraftPlan, DraftPlanner
from ovbuild.runtime.model.paged_model import PagedModel
from ovbuild.runtime.request import GenerationConfig, Request, Status
from ovbuild.runtime.scheduler import Scheduler
from ovbuild.runtime.speculation.drafters import BlockDrafter
from ovbuild.runtime.speculation.pace import MAX_PLAN_BACKOFF
from ovbuild.runtime.speculation.planner import FLUSH_ROWS, REPLAN_AFTER_CHANGE, REPLAN_RATIO, Speculation
from ovbuild.testing import TINY_TARGET
from ovbuild.testing.planner import fixed_cost, fixed_speculation
from ovbuild.testing.steered import SteeredDrafter

F32 = dict(kv_cache_precision="f32")
PROMPT = 10


class NeverDrafts(Speculation):
    """A planner whose every plan drafts for nobody (and counts its plans)."""

    plans = 0

    def plan(self, free, *args, **kwargs) -> list[int]:
        self.plans += 1
        return [0] * len(free)


def speculation(cls=Speculation) -> Speculation:
    return cls(7, 1, fixed_cost(1e-3, 1e-5), fixed_cost(1e-4, 1e-5), host_s=1e-4, learn_host=False)


def decoding(
    spec: Speculation, rid: int, remaining: int = 20, pinned: int | None = None, pending: int = 0, gap: int = 0
) -> Request:
    """A request decoding after 5 generated tokens, with `remaining` more to go, `pending` context rows not yet given
    to the draft and `gap` committed rows whose taps were never taken."""
    request = Request(
        rid, np.arange(PROMPT), GenerationConfig(max_new_tokens=5 + remaining, num_assistant_tokens=pinned)
    )
    request.status, request.generated = Status.DECODE, list(range(5))
    request.target_len = PROMPT + 4  # the last generated token is the anchor, not yet in the cache
    request.taps_len, request.pending_rows = request.target_len - gap, pending
    request.acceptance = spec.new_stats()
    return request


def test_a_plan_pins_caps_flushes_and_names_the_requests_to_catch_up():
    """Pinned lengths as pinned but never past what a request may still generate after its next token; a request
    with more pending taps than FLUSH_ROWS forces a draft call; a drafting request with a gap catches up first, one
    drafting nothing does not; a prefilling request's taps ride along but it gets no length."""
    spec = speculation()
    planner = DraftPlanner(spec, 7, 1, max_rows=64)
    pinned = decoding(spec, 0, pinned=3, gap=2)
    capped = decoding(spec, 1, remaining=2, pinned=5)
    idle = decoding(spec, 2, pinned=0, gap=4)
    flushing = decoding(spec, 3, pinned=0, pending=FLUSH_ROWS + 1)
    prefill = Request(4, np.arange(PROMPT), GenerationConfig())
    prefill.status = Status.PREFILL
    running = [pinned, capped, idle, flushing, prefill]
    assert not planner.wants_costs(running)  # every length is pinned: no cost model is read
    plan = planner.plan(running)
    assert plan.lengths == {0: 3, 1: 1, 2: 0, 3: 0}
    assert plan.flush and plan.catch_up == [pinned] and plan.requests == running


def test_the_planner_keeps_its_skip_counters_and_settles_them_per_request():
    """After a plan for nobody the planner backs off (1, then 2 steps): a skipped step is an empty plan, counted once
    for everybody, and each request is credited its skipped steps (as draft length 0) when it is next planned or
    leaves; a pinned length or a change of the batch brings the next plan forward."""
    spec = speculation(NeverDrafts)
    planner = DraftPlanner(spec, 7, 1, max_rows=64)
    a, b = decoding(spec, 0), decoding(spec, 1)
    for request in (a, b):
        planner.started(request)
    assert planner.wants_costs([a, b])
    plans = [planner.plan([a, b]) for _ in range(4)]
    assert [p == DraftPlan() for p in plans] == [False, True, False, True]
    assert spec.plans == 2 and spec.pace.backoff == 2 and planner.skipped == 2 and planner.skips_left == 1
    assert not planner.wants_costs([a, b])
    assert a.metrics.draft_length_histogram == [1]  # the step skipped before the second plan
    a.metrics.first_token_time = 1.0
    planner.released(a)
    assert a.metrics.draft_length_histogram == [2] and b.metrics.draft_length_histogram == [1]
    pinned = decoding(spec, 2, pinned=2)
    planner.started(pinned)
    plan = planner.plan([b, pinned])  # skips are left, but a pinned request drafts now
    assert plan.lengths == {1: 0, 2: 2} and spec.plans == 2 and planner.skips_left == 0
    planner.skips_left = 30
    third = decoding(spec, 3)
    planner.started(third)  # 3 decoding where the last plan had 2: REPLAN_RATIO times as many
    planner.plan([b, pinned, third])  # the change is weighed by the next plan; this step then skips
    assert planner.skips_left == REPLAN_AFTER_CHANGE - 1 and spec.planned_requests == 2 and REPLAN_RATIO == 1.5


def test_a_small_change_of_the_batch_keeps_the_pace_of_the_plans():
    """Requests that start or stop decoding bring the next plan forward only when their count moves REPLAN_RATIO
    times from the last plan's (4 -> 5 and 4 -> 3 keep the pace, 4 -> 6 does not), weighed once a step by its plan;
    a new scheduler's planner goes on at the pace its Speculation had backed off to when that was all the way."""
    spec = speculation(NeverDrafts)
    planner = DraftPlanner(spec, 7, 1, max_rows=64)
    four = [decoding(spec, i) for i in range(4)]
    for request in four:
        planner.started(request)
    planner.plan(four)
    assert spec.planned_requests == 4 and planner.skips_left == 1
    planner.skips_left = 30
    fifth, sixth = decoding(spec, 4), decoding(spec, 5)
    planner.started(fifth)
    planner.plan([*four, fifth])  # a change is weighed by the next step's plan
    assert planner.skips_left == 29, "5 where the last plan had 4: skipped"
    planner.started(sixth)
    planner.plan([*four, fifth, sixth])
    assert planner.skips_left == REPLAN_AFTER_CHANGE - 1
    planner.skips_left = 30
    for request in (fifth, sixth, *four[:2]):  # 2 left, but started and stopped within a step: weighed once
        request.metrics.first_token_time = 1.0
        planner.released(request)
    seventh = decoding(spec, 6)
    planner.started(seventh)
    planner.plan([*four[2:], seventh])
    assert planner.skips_left == 29, "3 where the last plan had 4: skipped"
    spec.pace.backoff = MAX_PLAN_BACKOFF
    assert DraftPlanner(spec, 7, 1, max_rows=64).skips_left == MAX_PLAN_BACKOFF
    spec.pace.backoff = 4  # the last plans drafted for nobody, perhaps for want of tokens left to draft: plan at once
    assert DraftPlanner(spec, 7, 1, max_rows=64).skips_left == 0


def test_the_step_plan_names_the_draft_length_its_rows_verify(models):
    """Every step plan's draft_lengths, request by request, are the proposals its verification then checks (the
    trace), and a pinned request's are its pinned length while it may still generate that many."""
    target_model, draft_model = models
    drafter = SteeredDrafter(BlockDrafter(draft_model, **F32), TINY_TARGET["vocab_size"], seed=3)
    scheduler = Scheduler(PagedModel(target_model, **F32), drafter, trace=True, speculation=fixed_speculation(drafter))
    plans = []
    schedule = scheduler.schedule
    scheduler.schedule = lambda: plans.append(schedule()) or plans[-1]
    pinned = scheduler.add_request(list(range(40, 52)), GenerationConfig(max_new_tokens=16, num_assistant_tokens=3))
    free = scheduler.add_request(list(range(60, 75)), GenerationConfig(max_new_tokens=16))
    scheduler.run()
    for request in (pinned, free):
        verified = [plan.draft_lengths[request.id] for plan in plans if request.id in plan.draft_lengths]
        assert verified == [len(step["proposed"]) for step in request.trace]
        assert len(verified) >= 4
    assert {plan.draft_lengths[pinned.id] for plan in plans if pinned.id in plan.draft_lengths} >= {3}
    assert all(k <= 3 for plan in plans for rid, k in plan.draft_lengths.items() if rid == pinned.id)

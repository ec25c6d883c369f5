"""Adaptive speculation in the scheduler: a draft that is always right gets full blocks and one that is always wrong
is stopped, drafting resumes after early misses and after a request's own poor record fades, steps without a plan
are counted once and plans back off and come back when the batch changes, host time leaves the calibration out,
and a padded draft call is kept at the rows it computed; output equals the target alone throughout."""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest

from ovbuild.runtime.model.paged_model import PagedModel
from ovbuild.runtime.request import GenerationConfig
from ovbuild.runtime.scheduler import Scheduler
from ovbuild.runtime.speculation.acceptance import AcceptanceStats
from ovbuild.runtime.speculation.calibration import CALIBRATION_ROWS, observe_calls
from ovbuild.runtime.speculation.drafters import BlockDrafter
from ovbuild.runtime.speculation.drafters.base import DraftItem
from ovbuild.runtime.speculation.pace import MAX_PLAN_BACKOFF
from ovbuild.runtime.speculation.planner import REPLAN_AFTER_CHANGE, Speculation
from ovbuild.testing import TINY_TARGET
from ovbuild.testing.planner import accepting, fixed_cost, fixed_speculation
from ovbuild.testing.steered import SteeredDrafter

F32 = dict(kv_cache_precision="f32")


@pytest.mark.parametrize("right", [True, False])
def test_scheduler_drafts_full_blocks_when_right_and_stops_when_wrong(models, right):
    """Costs fixed so that a draft call is as cheap as a target row: a draft that is always right gets full blocks,
    one that is always wrong is tried while the evidence is thin, then hardly ever again; output equals the target
    alone either way."""
    target_model, draft_model = models
    prompt, config = list(range(40, 60)), GenerationConfig(max_new_tokens=48)
    alone = Scheduler(PagedModel(target_model, **F32))
    expected = alone.add_request(prompt, config)
    alone.run()
    drafter = SteeredDrafter(BlockDrafter(draft_model, **F32), TINY_TARGET["vocab_size"], wrong_at=None if right else 0)
    drafter.wrong_rate = 0.0 if right else 1.0
    spec = fixed_speculation(drafter)  # measured costs and host time would vary with the machine
    scheduler = Scheduler(PagedModel(target_model, **F32), drafter, speculation=spec, trace=True)
    request = scheduler.add_request(prompt, config)
    drafter.truths[request.id] = [*prompt, *expected.generated]
    scheduler.run()
    assert request.generated == expected.generated
    lengths = request.metrics.draft_length_histogram
    if right:
        assert lengths[7] >= 4 and sum(lengths[1:7]) <= 1, lengths  # full blocks (the last steps are capped)
    else:
        # tried while the evidence is thin, then rarely as each retry adds a miss: at most 20 calls, the stretches
        # between retries never shorter than the one before (they grow to about 20 steps, where the fading of the
        # evidence and each retry's miss balance)
        drafted = "".join("d" if step["proposed"] else "." for step in request.trace)
        calls = [i for i, step in enumerate(drafted) if step == "d"]
        retries = [b - a for a, b in itertools.pairwise(calls) if b - a > 1]
        assert lengths[0] >= 25 and drafter.calls <= 20, drafted
        assert retries == sorted(retries) and all(r >= 5 for r in retries), drafted


def test_drafting_resumes_after_early_misses(models):
    """A draft wrong on its first three proposals and right ever after, at the demo pair's measured call costs
    (a draft call half a target call): the planner's estimate is optimistic while the evidence is thin, so drafting
    comes back; a greedy estimate stopped for good after those misses (the demo pair's first request kept a whole
    pipeline from drafting)."""
    target_model, draft_model = models
    prompt, config = list(range(40, 60)), GenerationConfig(max_new_tokens=60)
    alone = Scheduler(PagedModel(target_model, **F32))
    expected = alone.add_request(prompt, config)
    alone.run()
    drafter = SteeredDrafter(
        BlockDrafter(draft_model, **F32), TINY_TARGET["vocab_size"], wrong_rate=0.0, first_misses=3
    )
    spec = fixed_speculation(drafter, target=(2.8e-3, 3e-5), draft=(1.4e-3, 1e-5), host_s=5e-4)
    scheduler = Scheduler(PagedModel(target_model, **F32), drafter, speculation=spec)
    request = scheduler.add_request(prompt, config)
    drafter.truths[request.id] = [*prompt, *expected.generated]
    scheduler.run()
    assert request.generated == expected.generated
    m = request.metrics
    assert m.num_accepted_tokens >= 30, (m.draft_length_histogram, m.accepted_histogram)


def test_the_planners_host_time_leaves_the_calibration_out(models, monkeypatch):
    """The calibration runs inside the first step; its time is reported on its own, and the host time the planner
    adds to every plan stays what the steps spend outside the models (a calibration counted as host made any draft
    call look free next to it)."""
    import ovbuild.runtime.draft_step as draft_step_module

    def slow_calibration(speculation, target, drafter):
        speculation.calibration_tried = True
        time.sleep(0.3)

    monkeypatch.setattr(draft_step_module, "calibrate", slow_calibration)
    target_model, draft_model = models
    spec = Speculation(7, 1, fixed_cost(1e-3, 1e-5), fixed_cost(1e-4, 1e-5))
    scheduler = Scheduler(PagedModel(target_model, **F32), BlockDrafter(draft_model, **F32), speculation=spec)
    scheduler.add_request(list(range(40, 60)), GenerationConfig(max_new_tokens=8))
    scheduler.run()
    m = scheduler.metrics
    assert m.calibration_s >= 0.3 and m.wall_s >= m.calibration_s + m.host_s
    assert m.host_s < 0.3 and spec.host_s < 0.05, (m.host_s, spec.host_s)


class RecordOfMisses(Speculation):
    """Every request arrives with a long record of misses at every position (as if it had drafted badly before)."""

    def new_stats(self) -> AcceptanceStats:
        return accepting([0.0] * self.max_candidates, weight=20.0)


def test_a_request_that_stopped_drafting_fades_back_to_the_run(models):
    """A request whose own record says the draft misses, in a run whose record says it hits, and a draft that is in
    fact always right: while it does not draft its record fades, every idle step, towards the run's, so drafting
    comes back within a few dozen steps even though the planner backs off to every 8th step."""
    target_model, draft_model = models
    prompt, config = list(range(40, 60)), GenerationConfig(max_new_tokens=80)
    alone = Scheduler(PagedModel(target_model, **F32))
    expected = alone.add_request(prompt, config)
    alone.run()
    drafter = SteeredDrafter(BlockDrafter(draft_model, **F32), TINY_TARGET["vocab_size"], wrong_rate=0.0)
    spec = RecordOfMisses(7, 1, fixed_cost(2.8e-3, 3e-5), fixed_cost(1.4e-3, 1e-5), host_s=5e-4, learn_host=False)
    spec.run.reached[:], spec.run.accepted[:] = 1000.0, 900.0
    scheduler = Scheduler(PagedModel(target_model, **F32), drafter, speculation=spec)
    request = scheduler.add_request(prompt, config)
    drafter.truths[request.id] = [*prompt, *expected.generated]
    scheduler.run()
    assert request.generated == expected.generated
    lengths = request.metrics.draft_length_histogram
    assert lengths[0] >= 8, lengths  # it did stop drafting first
    assert request.metrics.num_accepted_tokens >= 30, lengths


class CountedPlans(Speculation):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.plans = 0
        self.sizes: list[int] = []  # requests planned for, per plan

    def plan(self, free, *args, **kwargs) -> list[int]:
        self.plans += 1
        self.sizes.append(len(free))
        return super().plan(free, *args, **kwargs)


def test_every_decode_step_is_counted_once_while_nobody_drafts(models):
    """A draft call costing a second: nobody drafts, the planner backs off to every 8th step and the steps between
    plans are counted in bulk; each request's draft lengths still add up to one per decode step (every committed
    token after the first), for requests that start and finish at different steps."""
    target_model, draft_model = models
    drafter = BlockDrafter(draft_model, **F32)
    spec = CountedPlans(7, 1, fixed_cost(1e-3, 1e-5), fixed_cost(1.0, 0.0), host_s=1e-4, learn_host=False)
    scheduler = Scheduler(PagedModel(target_model, **F32), drafter, speculation=spec, max_num_batched_tokens=16)
    lengths = ((3, 7), (24, 30), (11, 19))  # (prompt tokens, max_new_tokens): prompts of 24 prefill in two chunks
    requests = [scheduler.add_request(list(range(40, 40 + p)), GenerationConfig(max_new_tokens=n)) for p, n in lengths]
    scheduler.run()
    for request, (_, n) in zip(requests, lengths, strict=True):
        assert len(request.generated) == n
        assert request.metrics.draft_length_histogram == [n - 1], request.metrics.draft_length_histogram
    assert spec.plans < scheduler.metrics.steps // 2, (spec.plans, scheduler.metrics.steps)


def test_plans_back_off_while_nobody_drafts_and_come_back_when_the_batch_changes(models):
    """A draft call costing a second: plans back off to every MAX_PLAN_BACKOFF-th step for a steady batch, and a
    request that starts decoding is planned for within REPLAN_AFTER_CHANGE steps however far they had backed off."""
    target_model, draft_model = models
    spec = CountedPlans(7, 1, fixed_cost(1e-3, 1e-5), fixed_cost(1.0, 0.0), host_s=1e-4, learn_host=False)
    scheduler = Scheduler(PagedModel(target_model, **F32), BlockDrafter(draft_model, **F32), speculation=spec)
    scheduler.add_request(list(range(40, 50)), GenerationConfig(max_new_tokens=3 * MAX_PLAN_BACKOFF))
    steps_with_plan = []
    for step in range(2 * MAX_PLAN_BACKOFF + 8):
        plans = spec.plans
        scheduler.step()
        if spec.plans > plans:
            steps_with_plan.append(step)
    gaps = [b - a for a, b in itertools.pairwise(steps_with_plan)]
    assert max(gaps) == MAX_PLAN_BACKOFF + 1 and len(steps_with_plan) <= 8, steps_with_plan  # skipped + planned
    joined = scheduler.add_request(list(range(60, 64)), GenerationConfig(max_new_tokens=8))
    plans = spec.plans
    for _ in range(REPLAN_AFTER_CHANGE + 2):  # its prefill step, then at most REPLAN_AFTER_CHANGE steps to a plan
        scheduler.step()
    assert spec.plans > plans and spec.sizes[-1] == 2, spec.sizes
    scheduler.run()
    assert len(joined.generated) == 8


def test_a_padded_draft_call_is_kept_at_the_rows_it_computed(models):
    """A draft without static copies runs a call of fewer rows than the recent ones padded up to their row count
    (ovbuild.runtime.model.padding): its time is that of the padded rows, and the cost curve keeps it there
    (Drafter.rows_run), else calls of few rows after many looked as dear as many rows. Scheduler's draft calls and
    the calibration's both go through it."""
    _, draft_model = models
    drafter = BlockDrafter(draft_model, static_rows=False, **F32)
    assert drafter.model.static is None

    def call(context_rows: int, k: int) -> None:
        context = np.zeros((context_rows, drafter.tap_width), np.float32)
        drafter.propose([DraftItem(7, context, 0, k)])
        drafter.free(7)

    for _ in range(3):
        call(14, 7)  # 14 + 8 = 22 rows, steady: unpadded
    assert drafter.rows_run(22) == 22
    call(6, 3)  # 6 + 4 = 10 rows, after calls of 22: padded
    ran = drafter.rows_run(10)
    assert ran > 22, f"a 10-row call after 22-row ones ran {ran} rows"
    steered = SteeredDrafter(drafter, TINY_TARGET["vocab_size"])
    assert steered.rows_run(10) == ran

    spec = Speculation(drafter.max_candidates, drafter.candidate_offset)
    seen = []
    drafter.rows_run = lambda rows: seen.append(rows) or 40  # as if every call had run padded to 40 rows
    observe_calls(spec, lambda rows: 1e-3, lambda rows: 1e-4 * rows, drafter.rows_run)
    assert seen == list(CALIBRATION_ROWS) and spec.draft_cost.seen.sum() == 1, "every call kept at the 40 rows run"
    # the scheduler's draft calls too
    target_model, _ = models
    spec = Speculation(drafter.max_candidates, drafter.candidate_offset)
    spec.calibration_tried = True  # no timed calls: every observation comes from the scheduler's calls
    scheduler = Scheduler(PagedModel(target_model, **F32), drafter, speculation=spec)
    scheduler.add_request(list(range(40, 50)), GenerationConfig(8, num_assistant_tokens=3))
    scheduler.run()
    kept = {rows for calls in spec.draft_cost.recent for rows, _ in calls}
    assert kept == {40}, f"the scheduler's draft calls were kept at {kept} rows"

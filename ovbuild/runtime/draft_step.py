"""The draft side of a scheduling step: after verification, plan the draft lengths, then run that plan.

`DraftPlanner.plan` chooses, without running a model, a `DraftPlan`: the draft length of every decoding request
(pinned by num_assistant_tokens, else by ovbuild.runtime.speculation.planner from measured call costs and each request's
acceptance; 0 = no draft for it), whether pending taps force a draft call, and which requests catch up first. The
planner keeps its own counters: while its last plan drafted for nobody it backs off (Speculation.pace), and the
steps it skips are counted in bulk, settled per request when that request is next planned or finishes.
`DraftStep.execute` runs a plan: the catch-up (ovbuild.runtime.catch_up) of the requests to draft after a gap, then
one draft call, when any request drafts, packing per request the target taps it has not seen and a block of its
chosen length; with no request drafting there is no draft call and the taps wait for the next one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ovbuild.runtime.catch_up import catch_up, catch_up_rows
from ovbuild.runtime.metrics import RunMetrics
from ovbuild.runtime.model.paged_model import PagedModel
from ovbuild.runtime.request import Request, Status
from ovbuild.runtime.speculation.acceptance import IDLE_DECAY
from ovbuild.runtime.speculation.calibration import calibrate
from ovbuild.runtime.speculation.drafters.base import Drafter, DraftItem, Proposal
from ovbuild.runtime.speculation.planner import (
    FLUSH_ROWS,
    REPLAN_AFTER_CHANGE,
    REPLAN_RATIO,
    Speculation,
)


@dataclass
class DraftPlan:
    """The draft side of one step, chosen before any of its calls runs. Empty: a step without a plan (no call)."""

    requests: list[Request] = field(default_factory=list)  # the live requests: a draft call carries their taps
    lengths: dict[int, int] = field(default_factory=dict)  # decoding request id -> draft tokens it proposes next
    flush: bool = False  # a request's pending taps are over FLUSH_ROWS: a draft call happens anyway
    catch_up: list[Request] = field(default_factory=list)  # to draft after a gap: their missed taps come first


@dataclass(frozen=True)
class DraftCalls:
    """Seconds of the calls a draft step made, as the cost models see them, and whether it made a draft call."""

    catch_up_s: float = 0.0
    draft_s: float = 0.0
    drafted: bool = False


# A step the planner skips (it backed off): no plan, no call. Shared, and never changed by its readers: most steps of
# a pair where drafting does not pay are such steps, and on a small target (0.35 ms calls) each microsecond of them is
# 0.3% of the step.
SKIPPED = DraftPlan()
NO_CALLS = DraftCalls()


class DraftPlanner:
    """Chooses each step's draft lengths, and keeps the counters of the steps it skipped (one per scheduler)."""

    def __init__(self, speculation: Speculation, max_candidates: int, candidate_offset: int, max_rows: int):
        """max_candidates, candidate_offset: the drafter's; max_rows: the scheduler's max_num_batched_tokens."""
        self.speculation = speculation
        self.max_candidates, self.candidate_offset, self.max_rows = max_candidates, candidate_offset, max_rows
        # Steps left without a draft-length plan (PlanPace.backoff after a plan for nobody). A new scheduler goes on
        # at its planner's pace where it had backed off all the way: one request at a time, each scheduler's first
        # plan cost ~0.2 ms in a 64-token request's first step (0.9% of its steps on the losing pair of
        # bench_runtime.py --losing). Short of that, it plans at once: the last steps of a request may draft no more
        # than it may still generate, so its last plans draft for nobody and back off whether drafting pays or not;
        # going on at that pace, the next request of the demo pair drafted in none of its first steps (159 of ~480
        # steps drafting 0 against 25, one request at a time in bench_vs_genai.py).
        self.skips_left = speculation.pace.backoff if speculation.pace.idle else 0
        self.changed = False  # requests started or stopped decoding since the last plan (see batch_changed)
        self.skipped = 0  # steps skipped so far without a plan (Request.skipped_at marks each request's share)
        self.idle = 0  # steps since the last plan in which nobody drafted (the run-wide evidence ages by them)

    def block_rows(self, k: int) -> int:
        """Rows of a draft block proposing k tokens."""
        return k + self.candidate_offset

    def wants_costs(self, running: list[Request]) -> bool:
        """Whether the next plan reads the call-cost models (so they are calibrated first): a plan is due and some
        decoding request's draft length is the planner's to choose."""
        return self.skips_left == 0 and any(
            r.status is Status.DECODE and r.config.num_assistant_tokens is None for r in running
        )

    def plan(self, running: list[Request]) -> DraftPlan:
        """The draft lengths of the running requests for their next verification, and what forces or precedes the
        draft call. Runs no model."""
        if self.changed:
            self._weigh_change(sum(r.status is Status.DECODE for r in running))
        if self.skips_left > 0 and all(
            r.config.num_assistant_tokens is None and r.pending_rows <= FLUSH_ROWS for r in running
        ):
            # The last plan drafted for nobody and nothing forces a call: every decoding request drafts 0 this step,
            # counted in bulk when it is next planned or finishes (settle), not request by request per step.
            self.skips_left -= 1
            self.skipped += 1
            self.idle += 1
            return SKIPPED
        live = [r for r in running if r.status is not Status.FINISHED]
        flush = any(r.pending_rows > FLUSH_ROWS for r in live)
        decoding = [r for r in live if r.status is Status.DECODE]
        lengths = self._lengths(decoding, live, flush, running)
        behind = [r for r in decoding if lengths[r.id] and r.gap > 0]
        return DraftPlan(live, lengths, flush, behind)

    def _lengths(
        self, decoding: list[Request], live: list[Request], flush: bool, running: list[Request]
    ) -> dict[int, int]:
        """Draft tokens each decoding request gets verified next step: its num_assistant_tokens when pinned, else
        the speculation plan's choice; never more than the tokens it still may generate after the next one.
        live: the unfinished requests (a draft call carries their pending taps); flush: a draft call happens anyway."""
        for request in decoding:
            self.settle(request)
        lengths, free = {}, []
        for request in decoding:
            longest = max(0, min(self.max_candidates, request.remaining - 1))
            pinned = request.config.num_assistant_tokens
            if pinned is not None:
                lengths[request.id] = min(pinned, longest)
            else:
                free.append((request, longest))
        if free and self.skips_left > 0:
            self.skips_left -= 1  # the last plan drafted for nobody: the target alone runs, no plan is made
            self.idle += 1
            for request, longest in free:
                lengths[request.id] = 0
                request.acceptance.idle_steps += longest > 0
        elif free:
            pinned_rows = sum(k for k in lengths.values())
            fixed_target = len(decoding) + pinned_rows + self._prefill_rows(running)
            fixed_draft = sum(self.block_rows(k) for k in lengths.values() if k)
            context = sum(r.pending_rows for r in live)
            for request, _ in free:
                request.acceptance.settle(IDLE_DECAY)  # the steps skipped since the last plan fade it too
            self.speculation.age(self.idle)
            self.idle = 0
            chosen = self.speculation.plan(
                [(r.acceptance, longest) for r, longest in free],
                fixed_target,
                fixed_draft,
                context,
                flush,
                [r.gap for r, _ in free],
                len(live),
            )
            for (request, longest), k in zip(free, chosen, strict=True):
                lengths[request.id] = k
                if k == 0 and longest > 0:
                    request.acceptance.idle_steps += 1  # what it missed fades: drafting resumes when it pays
            self.idle += not any(chosen)
            self.skips_left = self.speculation.back_off(any(chosen))
            self.speculation.planned_requests = len(decoding)
        return lengths

    def _prefill_rows(self, running: list[Request]) -> int:
        """Prompt rows the next target call will run (prefilling requests, within the batch budget)."""
        left = sum(len(r.prompt) - r.target_len for r in running if r.status is Status.PREFILL)
        return min(left, self.max_rows)

    def started(self, request: Request) -> None:
        """A request starts decoding: skip steps before this one are not its own, and the batch changed."""
        request.skipped_at = self.skipped
        self.batch_changed()

    def released(self, request: Request) -> None:
        """A request leaves the batch (finished or aborted): it is owed its skipped steps, and the batch changed."""
        if request.metrics.first_token_time is not None:  # it decoded: its skipped steps are owed
            self.settle(request)
            if request.acceptance is not None:
                self.speculation.retire(request.acceptance)
        self.batch_changed()

    def batch_changed(self) -> None:
        """A request started or stopped decoding (or was preempted): weighed by the next plan, once for all the
        changes of a step (requests admitted together start one by one; see _weigh_change)."""
        self.changed = True

    def _weigh_change(self, decoding: int) -> None:
        """The batch changed to `decoding` decoding requests: plan again soon, however far the planner had backed off,
        when that is REPLAN_RATIO times the count of the last plan or at most its 1 / REPLAN_RATIO."""
        self.changed = False
        planned = self.speculation.planned_requests
        if decoding and max(decoding, planned) >= REPLAN_RATIO * max(min(decoding, planned), 1):
            self.skips_left = min(self.skips_left, REPLAN_AFTER_CHANGE)

    def settle(self, request: Request) -> None:
        """Account the steps skipped since the request was last planned: each drafted 0 tokens, and what the request
        has seen fades for each (drafting resumes when it pays)."""
        skipped = self.skipped - request.skipped_at
        if skipped:
            request.metrics.record_draft_length(0, skipped)
            request.acceptance.idle_steps += skipped
            request.skipped_at = self.skipped


class DraftStep:
    """Runs the draft side of each step on a paged target and its drafter: calibration, plan, catch-up, draft call."""

    def __init__(
        self,
        target: PagedModel,
        drafter: Drafter,
        speculation: Speculation,
        metrics: RunMetrics,
        max_num_batched_tokens: int,
        prefix_caching: bool,
    ):
        """metrics: the scheduler's (calibration, catch-up and draft seconds are added to it)."""
        self.target, self.drafter, self.speculation, self.metrics = target, drafter, speculation, metrics
        self.max_num_batched_tokens, self.prefix_caching = max_num_batched_tokens, prefix_caching
        self.planner = DraftPlanner(
            speculation, drafter.max_candidates, drafter.candidate_offset, max_num_batched_tokens
        )

    def step(self, running: list[Request]) -> DraftCalls:
        """Plan the running requests' next proposals and run the plan (the cost models are calibrated first, once,
        when the plan reads them)."""
        if self.planner.wants_costs(running):
            # timed calls of both models, once, right before the first plan that reads the costs: here, so that the
            # plan itself runs no model (the calibration reads no request, the plan's inputs are as they would be)
            start = time.perf_counter()
            calibrate(self.speculation, self.target, self.drafter)
            self.metrics.calibration_s += time.perf_counter() - start
        plan = self.planner.plan(running)
        return NO_CALLS if plan is SKIPPED else self.execute(plan)

    def execute(self, plan: DraftPlan) -> DraftCalls:
        """Catch up the plan's requests, record each decoding request's draft length, then make the draft call when
        any request drafts or the taps must be flushed; a request the catch-up could not fit drafts 0."""
        lengths = dict(plan.lengths)
        catch_up_s = self._catch_up(plan.catch_up, lengths)
        for request in plan.requests:
            if request.id in lengths:
                request.metrics.record_draft_length(lengths[request.id])
        if not any(lengths.values()) and not plan.flush:
            return DraftCalls(catch_up_s)  # nobody drafts: no draft call, the taps wait for the next one
        return DraftCalls(catch_up_s, self._draft_call(plan.requests, lengths), True)

    def _draft_call(self, live: list[Request], lengths: dict[int, int]) -> float:
        """One draft call: each request's pending taps and a block of its draft length; its seconds."""
        items, owners, spans = [], [], []
        for request in live:
            span = (request.taps_len - request.pending_rows, request.taps_len)  # the context rows this call commits
            context = request.take_taps()
            k = lengths.get(request.id, 0)
            anchor = request.anchor if k > 0 else None
            if context is None and anchor is None:
                continue
            items.append(DraftItem(request.id, context, anchor, k, request.config.sampling, len(request.generated)))
            owners.append(request)
            spans.append(span)
        before, compiled = self.drafter.infer_s, self.drafter.compile_s
        start = time.perf_counter()
        proposals = self.drafter.propose(items)
        seconds = time.perf_counter() - start
        self.metrics.draft_infer_s += self.drafter.infer_s - before
        block_rows = self.planner.block_rows
        rows = sum(_context_rows(i) + (block_rows(i.num_tokens) if i.anchor is not None else 0) for i in items)
        if self.drafter.compile_s == compiled:  # else a one-off (see Scheduler.execute)
            self.speculation.draft_cost.observe(self.drafter.rows_run(rows), seconds)
        cache = self.drafter.cache_manager
        for request, proposal, (start, end) in zip(owners, proposals, spans, strict=True):
            request.proposal = allowed_proposal(request, proposal)
            hashes = request.block_hashes(cache.block_size, end) if self.prefix_caching else None
            cache.commit(request.id, start, end, hashes)
        return seconds

    def _catch_up(self, behind: list[Request], lengths: dict[int, int]) -> float:
        """Give the requests that are to draft after a gap the taps they missed (ovbuild.runtime.catch_up), in one
        call of at most max_num_batched_tokens rows; a request it could not fit drafts 0 this step. Its seconds."""
        if not behind:
            return 0.0
        gaps = {r.id: catch_up_rows(self.target, r) for r in behind}  # a hybrid's go back to a kept state
        compiled, start = self.target.compile_s, time.perf_counter()
        caught = catch_up(self.target, behind, self.max_num_batched_tokens)
        seconds = time.perf_counter() - start
        rows = sum(gaps[r.id] for r in caught)
        self.metrics.target_infer_s += seconds
        self.metrics.catch_up_rows += rows
        if caught and self.target.compile_s == compiled:  # else a one-off (see Scheduler.execute)
            self.speculation.target_cost.observe(rows, seconds)
        for request in set(behind) - set(caught):
            lengths[request.id] = 0
            request.acceptance.expected = 0.0  # the plan's expectation: nothing is verified this step
            request.acceptance.idle_steps += 1
        return seconds


def _context_rows(item: DraftItem) -> int:
    return 0 if item.context is None else len(item.context)


def allowed_proposal(request: Request, proposal: Proposal) -> Proposal:
    """A request's draft proposal as its constraint allows it (the proposal itself when it has none)."""
    if request.constraint is None:
        return proposal
    return request.constraint.allowed_proposal(proposal, request.config.sampling, len(request.generated))

"""Adaptive speculation: how many draft tokens each request verifies next step (0 = no draft call for it).

Each step the scheduler asks `Speculation.plan` for every decoding request's draft length k. The plan maximises the
expected tokens per second of the next step,

    tokens(k) / (t_target(rows(k)) + [any k > 0] (t_draft(draft_rows(k)) + t_draft_host) + t_host)

where tokens(k) = sum over requests of 1 + r (s_1 + ... + s_k) (s_j: the chance that the first j proposals are all
accepted, from that request's observed acceptance per position, shrunk towards the run's as far as the spread between
the requests allows (request_weight), the run's taken one standard error optimistic, more while nobody drafts, so that
early misses do not stop drafting for good, and fading while nobody drafts; r, the realism:
tokens accepted per token the plans expected without that optimism, see REALISM_PRIOR), and the call times are
measured as a function of the rows a call computes (a static copy's or a padded call's, padding included;
ovbuild.runtime.speculation.call_cost: a shape calibrated once per pair and machine, refined by every call, times a
drift that follows the machine's speed call by call); host time is measured apart for steps with and without a draft
call, by the requests in the step. The draft works for the rows it runs: a request drafting k tokens costs k + 1
target rows and k + candidate_offset draft rows (the drafter runs a block of that length). A draft call also carries
every request's pending context rows: as many as the step commits are charged in full (each call of a drafting streak
carries the step before's), and a backlog beyond them (taps piled up while nobody drafted, a gap's) serves every later
step and is charged at a share (CATCH_UP_STEPS). A plan that makes a draft call where none is needed must beat not
drafting by DRAFT_MARGIN, and a plan that expects, without the optimism, to lose against drafting nobody is a try,
taken only while the exploration budget covers its expected loss (ovbuild.runtime.speculation.exploration).

Because every extra proposal adds one target row and one draft row, the best plan takes proposals in order of their
acceptance chance s_j (across requests), so the search is one sort and a scan over that order. That is exact with
candidate offset 0; with offset 1 a request's first proposal costs one more draft row, which the order ignores
(within 3.3% of the best plan over 200 random cost regimes, tests/test_plan_objective.py).
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ovbuild.runtime.speculation.acceptance import (
    DECAY,
    PRIOR_WEIGHT,
    RUN_DECAY,
    AcceptanceStats,
    pooled,
    request_weight,
    with_bonus,
)
from ovbuild.runtime.speculation.call_cost import CallCost
from ovbuild.runtime.speculation.exploration import ExplorationBudget
from ovbuild.runtime.speculation.host_time import HostTimes
from ovbuild.runtime.speculation.pace import PlanPace, longest_backoff

if TYPE_CHECKING:  # for annotations only: the planner itself runs no model
    from ovbuild.runtime.model.paged_model import PagedModel
    from ovbuild.runtime.speculation.drafters.base import Drafter

# The first position's acceptance before anything is observed: optimistic enough to try drafting. A deeper position's
# prior is the run's estimate of the position before it (acceptance per position is alike along a block): with a
# fixed prior, positions never reached kept looking likely however often the first proposal missed, and a draft wrong
# at its first token kept being tried.
PRIOR_ACCEPTANCE = 0.6
# Standard errors added to the run-wide estimate that plans choose by: a greedy planner that stopped drafting on a few
# early misses would never see the evidence that it was wrong (the demo pair's first request, rejected twice, kept a
# whole pipeline from drafting again); the bonus shrinks as verifications add up. What a plan expects (the realism,
# below; the exploration budget, ovbuild.runtime.speculation.exploration) is taken without it: counted in, the bonus on
# positions short plans never reach made full-block plans expect far more than they got (realism 0.47).
# While nobody drafts, the standard errors taken grow as UCB1's bonus does, to sqrt(EXPLORATION_GROWTH * ln(1 + steps
# since the last verification)) (Speculation.exploration): one unlucky first verification (4 requests at tau 5.6 on a
# Qwen3-4B-shaped pair, 2 of 4 proposals rejected at their first token) kept a run from drafting for its 200 steps
# where drafting 2 ran 1.28x. A draft seen to be poor over many verifications (a small standard error) waits for the
# run-wide record to fade (RUN_IDLE_DECAY). Along a block the bonuses add up as acceptance.with_bonus adds them.
OPTIMISM = 1.0
# UCB1 takes 2. With the bonuses added as acceptance.with_bonus adds them, 1 brought that unlucky record back after
# 102 steps, 2 tried a draft that is always wrong again 3 steps after its first misses, and 1.5 keeps both within
# bounds (57 steps; 5 or more, tests/test_speculation.py); multiplied along the block, 1 took 35.
EXPLORATION_GROWTH = 1.5
# Per step in which nobody drafts, the run-wide evidence (and the realism's counts) fade by this much: the planner
# learns only from the steps it drafts in, so an estimate made in a bad moment (early misses, a busy machine) would
# otherwise stand for the rest of the run. Fading back towards the priors, the planner tries again after about a
# half-life (230 steps) of not drafting; a draft that is really poor is dropped again on the fresh evidence.
RUN_IDLE_DECAY = 0.997  # each failed retry slows the fading (pace.MAX_PATIENCE)
FINISHED_KEPT = 16
# A plan that makes a draft call where none is needed must promise this many times the tokens per second of not
# drafting: within that the costs' noise decides, and a drafting step costs more than its calls show (the next plain
# call changes row count back, bench_row_padding.py). Break-even on the demo pair, thinner margins ran 0.90x.
DRAFT_MARGIN = 1.05
FLUSH_ROWS = 256  # pending context rows of one request that force a draft call (bounds host memory)
# A catch-up (the taps of rows that ran without them, ovbuild.runtime.catch_up) is paid once and serves every step the
# request then drafts, and more: taps are left out again only after six plans in a row drafted for nobody, backing
# off to pace.MAX_PLAN_BACKOFF (37 steps). A plan charges this share of it: planning one step ahead, a plan that
# charged all of it would never draft again after a long gap.
CATCH_UP_STEPS = 32
# A request that starts or stops decoding changes what a draft call would cost per request: the next plan comes
# within this many steps however far the planner had backed off, when the decoding requests are REPLAN_RATIO times as
# many as at the last plan, or as few as 1 / REPLAN_RATIO of them. A smaller change moves the step's costs little
# (the plans keep their pace): one request after another, each new one drew a plan of ~0.2 ms on the losing pair.
REPLAN_AFTER_CHANGE = 4
REPLAN_RATIO = 1.5
# Plans draft for a request when its recent acceptance was high, and acceptance regresses to the mean: the tokens a
# plan expects are more than its verifications accept. With bf16 target math on the demo pair the planner drafted in
# 58% of the steps, one request at a time, where every pinned k lost to the target alone (floor 0.83x), and ran at
# 0.71x. So the accepted tokens a plan expects are scaled by how many the plans' verifications have accepted per
# token expected: a prior of REALISM_PRIOR tokens at 1.0, each verification's counts decaying by REALISM_DECAY.
REALISM_PRIOR = 8.0
REALISM_DECAY = 0.98


@dataclass
class Speculation:
    """Call-cost models of the target and the draft, the run-wide acceptance, and the per-step plan."""

    max_candidates: int
    candidate_offset: int = 1
    target_cost: CallCost = field(default_factory=CallCost)
    draft_cost: CallCost = field(default_factory=CallCost)
    host_s: float = 0.0  # scheduler overhead per step outside the calls, steps without a draft call (EMA)
    # What a step with a draft call adds to host_s: taking the taps, verifying proposals, recording acceptance. Left
    # out, a drafting step looked cheaper than it was, and the demo pair drafted one request at a time at 0.88x of
    # never drafting while its plans expected a gain.
    draft_host_s: float = 0.0
    calibration_tried: bool = False  # calibration runs once, before the first plan (see DraftStep.step)
    # where a calibration's timings are kept and found (ovbuild.runtime.speculation.calibration.CalibrationCache); None:
    # timed
    calibration_cache: object | None = None
    pace: PlanPace = field(default_factory=PlanPace)  # steps between plans while nobody drafts
    planned_requests: int = 0  # the requests decoding at the last plan (see REPLAN_RATIO)
    learn_host: bool = True  # False: host_s stays as set (fixed plans for tests, ovbuild.testing.planner)
    plan_s: float = 0.0  # seconds a plan takes (EMA; see pace.PLAN_SHARE)
    plain_step_s: float = 0.0  # what the last plan priced a step without drafting at (its target call and host time)
    run: AcceptanceStats = field(init=False)  # every request's verifications (record adds, age fades them)
    _drafting_host: float = field(init=False, default=0.0)  # host seconds of steps with a draft call (EMA)
    host_times: HostTimes = field(init=False, default_factory=HostTimes)  # the recent steps' (see host_costs)
    # survival's run-wide terms (optimistic, plain), until a record or aging moves them
    _run_estimate: tuple[list[float], list[float]] | None = field(init=False, default=None)
    # accepted draft tokens the plans expected, and those their verifications accepted (decayed; see REALISM_PRIOR)
    expected_tokens: float = field(init=False, default=0.0)
    accepted_tokens: float = field(init=False, default=0.0)
    since_drafted: int = field(init=False, default=0)  # steps since the last verification of proposals (see OPTIMISM)
    budget: ExplorationBudget = field(init=False, default_factory=ExplorationBudget)  # what tries may still lose
    _verified: bool = field(init=False, default=False)  # a verification since the last plan (see RUN_DECAY)
    # (accepted, reached) of the last requests that finished, all positions pooled (see REQUEST_WEIGHT)
    finished: deque[tuple[float, float]] = field(init=False, default_factory=lambda: deque(maxlen=FINISHED_KEPT))

    def __post_init__(self):
        self.run = AcceptanceStats.empty(self.max_candidates)
        if self.draft_cost.follows is None and self.draft_cost is not self.target_cost:
            # both models run on the same cores: the target's calls, made every step, tell how fast the machine is
            # now, while the draft is called only when drafting (CallCost.follows)
            self.draft_cost.follows = self.target_cost

    @classmethod
    def for_pair(cls, target: PagedModel, drafter: Drafter) -> Speculation:
        """A planner for `drafter` drafting for `target` (PagedModel), whose costs go by the rows each call computes."""
        return cls(
            drafter.max_candidates,
            drafter.candidate_offset,
            CallCost(computed=target.computed_rows),
            CallCost(computed=drafter.computed_rows),
        )

    @property
    def calibrated(self) -> bool:
        return self.target_cost.calibrated and self.draft_cost.calibrated

    def back_off(self, drafted: bool) -> int:
        """A plan was made (`drafted`: for somebody): the steps to skip before the next (PlanPace.after_plan)."""
        return self.pace.after_plan(drafted, longest_backoff(self.plan_s, self.plain_step_s))

    def observe_host(self, seconds: float, drafted: bool = False, requests: int = 1) -> None:
        """One step's seconds outside its calls; `drafted`: the step made a draft call; `requests`: in the step."""
        if not self.learn_host:
            return
        if drafted:
            self._drafting_host = _ema(self._drafting_host, seconds)
        else:
            self.host_s = _ema(self.host_s, seconds)
        if self._drafting_host:
            self.draft_host_s = max(self._drafting_host - self.host_s, 0.0)
        self.host_times.observe(seconds, drafted, requests)

    def host_costs(self, requests: int) -> tuple[float, float]:
        """(host seconds of a step of `requests` requests without a draft call, what a draft call adds to them): the
        recent steps' medians (HostTimes.costs), host_s and draft_host_s as set without learn_host."""
        measured = self.host_times.costs(requests, self.draft_host_s) if self.learn_host else None
        return measured or (self.host_s, self.draft_host_s)

    def request_weight(self, stats: list[AcceptanceStats]) -> float:
        """Observations the run-wide estimate is worth in these requests' own (request_weight, over them and the
        requests that finished last)."""
        return request_weight([pooled(s) for s in stats] + list(self.finished))

    def retire(self, stats: AcceptanceStats) -> None:
        """A request finished: its pooled record joins those the request weight is estimated from."""
        if stats.reached.sum() > 0:
            self.finished.append(pooled(stats))

    def new_stats(self) -> AcceptanceStats:
        return AcceptanceStats.empty(self.max_candidates)

    def record(self, stats: AcceptanceStats, proposed: int, accepted: int) -> None:
        """A verification's outcome, into the request's and the run's statistics."""
        if proposed:
            stats.record(proposed, accepted, DECAY)
            self.run.record(proposed, accepted, 1.0)
            self._verified = True  # the record fades once for the step, at the next plan (RUN_DECAY)
            self._run_estimate = None
            self.since_drafted = 0
        if stats.expected:  # a plan's choice (a pinned k expects nothing)
            self.budget.settle(accepted, stats.expected)
            self.expected_tokens = REALISM_DECAY * self.expected_tokens + stats.expected
            self.accepted_tokens = REALISM_DECAY * self.accepted_tokens + accepted
            stats.expected = 0.0

    @property
    def realism(self) -> float:
        """Accepted per expected draft token of the plans so far (1.0 before any: the prior)."""
        return (self.accepted_tokens + REALISM_PRIOR) / (self.expected_tokens + REALISM_PRIOR)

    def survival(
        self, stats: list[AcceptanceStats], optimistic: bool = True, weight: float | None = None
    ) -> list[list[float]]:
        """s [requests][max_candidates]: s_j = the chance that proposals 1..j+1 are all accepted, per request;
        optimistic: with the run-wide estimate's OPTIMISM bonus (what plans choose by), else without (what they
        expect); weight: the run-wide estimate's in each request's own (Speculation.request_weight if None)."""
        if self._run_estimate is None:  # only verifications and aging move it: plans in between reuse it
            run, prior = [], PRIOR_ACCEPTANCE
            for accepted, reached in zip(self.run.accepted.tolist(), self.run.reached.tolist(), strict=True):
                prior = (accepted + PRIOR_WEIGHT * prior) / (reached + PRIOR_WEIGHT)  # the next position's prior
                run.append(prior)
            self._run_estimate = with_bonus(run, self.run.reached.tolist(), self.exploration), run
        estimate = self._run_estimate[0 if optimistic else 1]
        if weight is None:
            weight = self.request_weight(stats)
        survival = []
        for request in stats:
            chance, row = 1.0, []
            positions = zip(request.accepted.tolist(), request.reached.tolist(), estimate, strict=True)
            for accepted, reached, run in positions:
                chance *= (accepted + weight * run) / (reached + weight)
                row.append(chance)
            survival.append(row)
        return survival

    @property
    def exploration(self) -> float:
        """Standard errors added to the run-wide estimate: OPTIMISM, growing while nobody drafts (see OPTIMISM)."""
        return max(OPTIMISM, math.sqrt(EXPLORATION_GROWTH * math.log1p(self.since_drafted)))

    def age(self, idle_steps: int) -> None:
        """Steps in which nobody drafted: the run-wide evidence and the realism's counts fade (RUN_IDLE_DECAY)."""
        if idle_steps <= 0:
            return
        self.since_drafted += idle_steps
        self.budget.earn(idle_steps, self.plain_step_s)
        fade = RUN_IDLE_DECAY ** (idle_steps / self.pace.patience)
        self.run.fade(fade)
        self.expected_tokens *= fade
        self.accepted_tokens *= fade
        self._run_estimate = None

    def plan(
        self,
        free: list[tuple[AcceptanceStats, int]],
        fixed_target_rows: int,
        fixed_draft_rows: int,
        context_rows: int,
        force_draft: bool,
        gaps: list[int] | None = None,
        requests: int | None = None,
    ) -> list[int]:
        """Draft length of each free request, maximising expected tokens per second of the next step.

        free: (acceptance statistics, longest allowed k) of the requests whose k is ours to choose;
        fixed_target_rows: rows the next target call runs whatever we choose (pinned requests, prompt chunks, one
        anchor row per free request); fixed_draft_rows: draft rows of pinned requests; context_rows: pending context
        rows of every request (any draft call carries them); force_draft: a draft call happens anyway; gaps: each free
        request's committed rows without taps, which the target runs again before it drafts (ovbuild.runtime.
        catch_up) and its draft call carries; requests: in the step (host time goes by them; len(free) if None).
        Pending context up to what the step commits is charged in full (a drafting streak carries that much every
        step); context beyond it (a backlog, a gap's) is taken in once and serves every later step: like the catch-up
        call, its share of the draft call is charged at 1 / CATCH_UP_STEPS. Charged in full, the context that piled
        up while nobody drafted made every later draft call look dearer (4 requests on the demo pair: 281 pending
        rows, 2.9 ms against 0.9 ms for the blocks alone) until drafting never resumed.

        Plain Python, the cost curves' prices too (CallCost.prices): a plan runs right after a model call, where each
        small numpy call costs several microseconds (cold caches)."""
        if not free or max(k for _, k in free) <= 0:
            return [0] * len(free)  # nothing to choose: nobody may draft
        start = time.perf_counter()
        if self._verified:
            self.run.fade(RUN_DECAY)
            self._run_estimate, self._verified = None, False
        weight = self.request_weight([s for s, _ in free])
        survival = self.survival([s for s, _ in free], weight=weight)
        # every proposal that may be taken, best first; ties keep request-major order, each request's positions in order
        order = sorted(
            (-chance, request, j)
            for request, ((_, longest), chances) in enumerate(zip(free, survival, strict=True))
            for j, chance in enumerate(chances[:longest])
        )
        gaps = gaps or [0] * len(free)
        tokens, blocks, caught = [float(len(free))], [0], [0]  # of the plans taking the first m proposals, m = 0..M
        realism = self.realism
        for negative_chance, request, j in order:
            tokens.append(tokens[-1] - realism * negative_chance)
            blocks.append(blocks[-1] + 1 + (self.candidate_offset if j == 0 else 0))  # a block of k + offset rows
            caught.append(caught[-1] + (gaps[request] if j == 0 else 0))  # a first proposal brings its gap's rows
        target = self.target_cost.prices(range(fixed_target_rows, fixed_target_rows + len(tokens)))
        # A draft call carries the blocks and the context rows committed since the last one. While drafting goes on,
        # those are what each step commits (the step's tokens), paid every step: they are charged in full. Only the
        # context beyond that, a backlog from steps without a draft call, is charged at its share.
        steady = [min(context_rows, t) for t in tokens]
        own = [b + fixed_draft_rows + s for b, s in zip(blocks, steady, strict=True)]
        blocks_s = self.draft_cost.prices(own)
        whole = self.draft_cost.prices(o + c + context_rows - s for o, c, s in zip(own, caught, steady, strict=True))
        draft = [b + (w - b) / CATCH_UP_STEPS for b, w in zip(blocks_s, whole, strict=True)]
        if caught[-1]:
            catch = self.target_cost.prices(caught)
            draft = [d + (t / CATCH_UP_STEPS if c else 0.0) for d, t, c in zip(draft, catch, caught, strict=True)]
        anyway = force_draft or fixed_draft_rows > 0
        host_s, draft_host_s = self.host_costs(len(free) if requests is None else requests)
        drafting = [draft[m] + draft_host_s if m or anyway else 0.0 for m in range(len(tokens))]
        seconds = [max(target[m] + host_s + drafting[m], 1e-9) for m in range(len(tokens))]
        rates = [t / s for t, s in zip(tokens, seconds, strict=True)]
        best = rates.index(max(rates))  # the fewest proposals among equally good plans
        plain = self.survival([s for s, _ in free], False, weight) if best else [[]] * len(free)
        expected = [float(len(free))]  # tokens as expected without the optimism (see exploration.ExplorationBudget)
        for _, request, j in order[:best]:
            expected.append(expected[-1] + realism * plain[request][j])
        token_s = seconds[0] / tokens[0]  # a plain step's seconds per token
        losses = [seconds[m] - expected[m] * token_s for m in range(best + 1)]
        best = self.budget.best(rates, losses, seconds[0])
        if not anyway and best and rates[best] < DRAFT_MARGIN * rates[0]:
            best = 0  # a draft call that is not needed anyway must promise more than the costs' noise
        if not anyway and best and self.target_cost.outdated(fixed_target_rows):
            # What the plain step costs now is not known (no recent call of its rows, call_cost.PHASE_CALLS): run
            # one to time it. On the demo pair, 4 requests at once drafted in every step against a 4-row call time
            # left from one request at a time (4.6 ms, where 4-row steps took 3.5 to 3.9 ms).
            best = 0
        self.budget.spend(losses[best], token_s, realism)
        if best:
            self.budget.earn(1, seconds[0])  # the step it plans (a step without a draft is counted by age)
        lengths = [0] * len(free)
        for _, request, _ in order[:best]:
            lengths[request] += 1
        for (stats, _), chances, k in zip(free, plain, lengths, strict=True):
            stats.expected = sum(chances[:k])
        self.plain_step_s = target[0] + host_s
        if self.learn_host:
            self.plan_s = _ema(self.plan_s, time.perf_counter() - start)
        return lengths


def _ema(average: float, value: float) -> float:
    """Exponential moving average over about 10 values; the first value starts it."""
    return average + 0.1 * (value - average) if average else value

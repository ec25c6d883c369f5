"""The plans' pace: how many steps go by without a draft-length plan while the plans draft for nobody.

A plan that drafts for nobody is followed by plans every 2nd, 4th, 8th, ... step (MAX_PLAN_BACKOFF), further apart
where a plan is dear next to the steps between two (PLAN_SHARE). A short drafting streak begun while backing off is
a retry: when it ends, backing off resumes where it stood, and each failed retry makes the planner's run-wide
evidence fade more slowly (its patience, MAX_PATIENCE; ovbuild.runtime.speculation.planner.Speculation.age).
"""

from __future__ import annotations

from dataclasses import dataclass

# Steps without a plan, at most, while the last plans drafted for nobody: such a plan's inputs barely move, and one
# costs ~0.1 ms right after a model call (cold caches); at every 8th step plans were 3% of a demo-pair step.
MAX_PLAN_BACKOFF = 32
# Further apart where a plan costs more than this share of the plain steps between two plans, up to MAX_PLAN_BACKOFF
# times MAX_PATIENCE: with 16 requests on the losing pair (bench_runtime.py --losing) a plan took ~0.64 ms, half a step.
# Not less: a planner backed off where drafting has come to pay waits for its next plan. Plans (Speculation.plan_s)
# are timed only where host time is learnt (learn_host).
PLAN_SHARE = 0.005
# A drafting streak of at most this many plans that began while the planner was backing off is a retry: when it ends,
# backing off resumes where it stood, not from 1 (on the losing pair each failed retry otherwise cost six plans,
# ~0.5 ms, on the way back to MAX_PLAN_BACKOFF).
RETRY_PLANS = 2
# Each retry that fails doubles the half-life over which the run-wide evidence fades while nobody drafts
# (planner.RUN_IDLE_DECAY), up to MAX_PATIENCE times; drafting that takes hold resets it. On the losing pair of
# bench_runtime.py --losing with 4 requests, retries every ~230 steps ran 0.90x the target alone, 0.93x with this
# patience and 0.94x with none (docs/speed.md): failures in a row are what fading forgets.
MAX_PATIENCE = 8


def longest_backoff(plan_s: float, plain_step_s: float) -> int:
    """Steps between plans at most while nobody drafts: MAX_PLAN_BACKOFF, or as many as keep plans of `plan_s`
    seconds within PLAN_SHARE of the plain steps' time (`plain_step_s` each), up to MAX_PLAN_BACKOFF * MAX_PATIENCE."""
    if plain_step_s <= 0:
        return MAX_PLAN_BACKOFF
    paced = plan_s / (PLAN_SHARE * plain_step_s)
    return int(min(max(paced, MAX_PLAN_BACKOFF), MAX_PLAN_BACKOFF * MAX_PATIENCE))


@dataclass
class PlanPace:
    """Steps between plans while nobody drafts, the retry under way, and the patience failed retries built up.

    Kept by the planner, across a pipeline's runs like its costs: one request at a time, each new scheduler backed
    off from 1 again, and a 64-token request made 6 plans where 2 would do."""

    backoff: int = 0  # steps to skip before the next plan (doubling up to the longest backoff)
    paused_backoff: int = 0  # the backoff the current drafting streak began at
    streak: int = 0  # the current drafting streak's plans so far (see RETRY_PLANS)
    patience: int = 1  # how many times the base half-life the run-wide evidence fades over (MAX_PATIENCE)

    @property
    def idle(self) -> bool:
        """Backed off all the way: the last plans drafted for nobody."""
        return self.backoff >= MAX_PLAN_BACKOFF

    def after_plan(self, drafted: bool, longest: int) -> int:
        """A plan was made (`drafted`: for somebody): the steps to skip before the next, at most `longest`."""
        if drafted:
            self.paused_backoff = self.backoff or self.paused_backoff
            self.backoff, self.streak = 0, self.streak + 1
            if self.streak > RETRY_PLANS:
                self.patience = 1  # drafting took hold: forget at the base pace again
            return 0
        retried = 0 < self.streak <= RETRY_PLANS and self.paused_backoff > 0
        if retried:  # and it failed
            self.patience = min(2 * self.patience, MAX_PATIENCE)
        level = self.paused_backoff if retried else 0
        self.backoff = min(2 * (self.backoff or level) or 1, longest)
        self.paused_backoff, self.streak = 0, 0
        return self.backoff

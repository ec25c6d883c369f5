"""The exploration budget: how much the plans that try drafting against the evidence may lose.

The planner chooses plans by an optimistic acceptance (ovbuild.runtime.speculation.planner.OPTIMISM): thin or faded
evidence gets tried again. That chooses which plans to try, not what a try may cost. A plan is an exploration as far
as it expects, without the optimism, fewer tokens per second than drafting nobody: its expected loss is its time less
what its expected tokens take at the plain step's rate. Explorations may lose at most EXPLORATION_SHARE of the run's
time: every step earns that share of a plain step's price as credit, a plan whose expected loss is more than the
credit left is not taken, and a plan that pays as expected costs none. What an exploration then accepts beyond what
it expected is credited back (a try that found the draft good buys the next), what it accepted short is charged.

Unbudgeted, each retry drafted the whole optimistic plan: 4 requests at tau 8.2 on the Qwen3-4B-shaped pair under AVX2
kernels, where no draft length pays (a 32-row verify takes 6.3 times a 4-row one), drafted 7 for every request in 2%
of the steps, each such step about 7 plain steps' time for 5 to 6 steps' tokens, and ran 0.93x the target alone. With
the budget no try fits there, and it ran 0.99x (0.97x and 1.03x at tau 3.4 and 5.6; docs/speed.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Explorations lose at most this share of the run's time (with the credit saved up, CREDIT_STEPS, besides): a draft
# pipeline that does not pay must stay within a few percent of its target alone, and its host work takes 1% to 3% of
# that already on small targets (bench_runtime.py --losing). Simulated as tests/test_exploration_budget.py does (the
# AVX2 curve, 4 requests, 256 steps, four seeds, acceptance 0.71 to 0.90 a position), the tries lost 2.6% to 4.3% of
# the time at 2% with five steps saved, and none at 1% with three.
EXPLORATION_SHARE = 0.01
# The credit saved up at most, in plain steps' time: a budget saved over a long drafting stretch is not spent in one
# burst of tries when acceptance falls, and a try dearer than this many plain steps is never taken. A new planner
# starts with all of it: the first plans' misses are the thinnest evidence (a draft wrong at its first three blocks and
# right ever after, tests/test_speculation.py, drafted again 5 steps after its third miss with it, and not in the
# request's 60 tokens without).
CREDIT_STEPS = 3.0


@dataclass
class ExplorationBudget:
    """Seconds that explorations may still lose, and the last plan's exploration awaiting its outcome."""

    credit: float = math.inf  # capped to CREDIT_STEPS plain steps at the first plan
    token_s: float = 0.0  # the exploring plan's plain step, seconds per token (0: the last plan did not explore)
    realism: float = 1.0  # the realism its expected tokens were scaled by

    def earn(self, steps: int, step_s: float) -> None:
        """`steps` steps of `step_s` seconds each (a plain step's price) went by."""
        self.credit += EXPLORATION_SHARE * steps * step_s

    def best(self, rates: list[float], losses: list[float], step_s: float) -> int:
        """The plan of the highest rate (fewest proposals among equals) whose expected loss the credit, first capped
        at CREDIT_STEPS plain steps, covers; losses[m]: plan m's expected seconds lost against drafting nobody (plan
        0); step_s: a plain step's price."""
        self.credit = min(self.credit, CREDIT_STEPS * step_s)
        allowed = [m for m, loss in enumerate(losses) if m == 0 or loss <= max(self.credit, 0.0)]
        return max(allowed, key=lambda m: (rates[m], -m))

    def spend(self, loss: float, token_s: float, realism: float) -> None:
        """The plan taken expects to lose `loss` seconds (an exploration if positive); token_s: a plain step's seconds
        per token; realism: its expected tokens' scale."""
        self.token_s = token_s if loss > 0 else 0.0
        self.credit -= max(loss, 0.0)
        self.realism = realism

    def settle(self, accepted: int, expected: float) -> None:
        """One request's verification of the exploring plan: `accepted` tokens where it expected `expected`
        (before the realism)."""
        self.credit += (accepted - self.realism * expected) * self.token_s

"""Acceptance statistics: per draft position, the verifications of a request (or of the whole run) that reached it and
those that accepted it, how much a request's own record counts against the run's (empirical Bayes), and the
exploration bonus on the run's (with_bonus)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# Observations the run-wide estimate is worth in a request's own: at least REQUEST_WEIGHT; with several requests, as
# much as the spread between the requests' acceptance allows (empirical Bayes, request_weight): where requests accept
# alike, a request's own ten or so recent verifications are mostly luck. Weighed at 4 on a Qwen3-4B-shaped pair, 4
# requests at one acceptance (tau 8.2), the lucky ones were given full blocks of 15 in a quarter of the steps and the
# plans ran at 0.87x of drafting 4 for all. The spread is taken over the requests being planned and the last few that
# finished (planner.FINISHED_KEPT), so that one request at a time is weighed by how its predecessors differed: alone,
# a request's streak of right tokens drew full blocks of 15 at tau 5.6 where 7 ran faster.
REQUEST_WEIGHT = 4.0
MAX_REQUEST_WEIGHT = 64.0
DECAY = 0.9  # per verification: a request's recent steps count more (code loops, boilerplate, then prose)
IDLE_DECAY = 0.95  # per step without a draft: a request's evidence fades back to the run-wide estimate
PRIOR_WEIGHT = 2.0  # observations the prior (the position before's estimate) is worth in the run-wide estimate
# Per step with a verification, the run-wide record (Speculation.run) fades by this much (about 200 steps' memory):
# acceptance moves from text to text, and the record of a position plans stopped reaching would otherwise stand for
# good. On the demo pair one request at a time, plans once drafted 1 in 556 of 584 steps against a second position seen
# poor early on (tests/test_planner_statistics.py: such a record, kept whole, held a planner at 1 for 400 steps where 3
# ran 1.27x). Per step, not per verification: acceptance moves with time, and with 16 requests a fade per verification
# would keep about a dozen steps of evidence. With 4 requests at Qwen3-4B shape the two read alike (docs/speed.md).
RUN_DECAY = 0.995


@dataclass
class AcceptanceStats:
    """Per draft position j: (decayed) verifications that reached j and those that accepted it."""

    reached: np.ndarray
    accepted: np.ndarray
    idle_steps: int = 0  # steps without a draft whose fading is still owed (settled before the next plan)
    expected: float = 0.0  # draft tokens the last plan expected this request to get accepted (0: it planned none)

    @classmethod
    def empty(cls, positions: int) -> AcceptanceStats:
        return cls(np.zeros(positions), np.zeros(positions))

    def record(self, proposed: int, accepted: int, decay: float) -> None:
        """One verification: positions 0..accepted were reached (up to `proposed`), the first `accepted` kept, after
        the record fades by `decay` (1.0: not at all, as the run-wide record, which fades per step: RUN_DECAY)."""
        if decay != 1.0:
            self.fade(decay)
        self.reached[: min(accepted + 1, proposed)] += 1
        self.accepted[:accepted] += 1

    def fade(self, decay: float) -> None:
        self.reached *= decay
        self.accepted *= decay

    def settle(self, decay: float) -> None:
        """Fade by `decay` once per idle step owed: the scheduler counts idle steps between plans and pays them here."""
        if self.idle_steps:
            self.fade(decay**self.idle_steps)
            self.idle_steps = 0


def pooled(stats: AcceptanceStats) -> tuple[float, float]:
    """A request's (accepted, reached), all positions pooled."""
    return float(stats.accepted.sum()), float(stats.reached.sum())


def request_weight(counts: list[tuple[float, float]]) -> float:
    """Observations the run-wide estimate is worth in each request's own, from how much more the requests' acceptance
    (counts: each request's pooled (accepted, reached)) differs than their counts explain: the between-request
    variance tau^2 by the method of moments (DerSimonian-Laird), and the Beta prior whose variance that is,
    p (1 - p) / tau^2 - 1 observations; between REQUEST_WEIGHT and MAX_REQUEST_WEIGHT (REQUEST_WEIGHT with fewer than
    2 requests seen)."""
    counts = [(a, n) for a, n in counts if n > 0]
    total = sum(n for _, n in counts)
    if len(counts) < 2:
        return REQUEST_WEIGHT
    p = sum(a for a, _ in counts) / total
    if p <= 0 or p >= 1:
        return MAX_REQUEST_WEIGHT
    spread = sum(n * (a / n - p) ** 2 for a, n in counts)  # counts of n alone make (k - 1) p (1 - p) of it
    between = (spread - (len(counts) - 1) * p * (1 - p)) / (total - sum(n * n for _, n in counts) / total)
    if between <= 0:
        return MAX_REQUEST_WEIGHT
    return min(max(p * (1 - p) / between - 1, REQUEST_WEIGHT), MAX_REQUEST_WEIGHT)


def with_bonus(run: list[float], reached: list[float], bonus: float) -> list[float]:
    """The run-wide chances per position (`run`; each position reached so often) raised by `bonus` standard errors:
    each survival s_j = p_1 ... p_j raised by its positions' bonuses, added as errors that move together as far as
    one position's estimate is the other's, and given back as chances per position.

    A position's estimate is its own record mixed with the position before's (the chain in Speculation.survival),
    p_i = (accepted_i + PRIOR_WEIGHT p_(i-1)) / (reached_i + PRIOR_WEIGHT), so its variance is carried down the chain:
    V_i = w_i^2 V_(i-1) + reached_i p_i (1 - p_i) / (reached_i + PRIOR_WEIGHT)^2, w_i = PRIOR_WEIGHT / (reached_i +
    PRIOR_WEIGHT) (the first position's prior worth PRIOR_WEIGHT observations, so V_1 = p_1 (1 - p_1) / (reached_1 +
    PRIOR_WEIGHT)). A position never reached has the variance of the one before, and it moves with it; a position
    reached often has its own count's, and moves on its own. Position i's bonus on log s_j is log(1 + bonus sqrt(V_i)
    / p_i), and two neighbours' errors are correlated by w_i sqrt(V_(i-1) / V_i) (a chain: further apart, by the
    product of the correlations between).

    Why not simpler. With each position's own count alone, p (1 - p) / (reached + PRIOR_WEIGHT), rarely reached deep
    positions made long blocks look likely (4 requests at tau 5.6 on a Qwen3-4B-shaped pair: k = 7 in 45% of the
    steps where k = 2 ran 1.11x and k = 7 0.94x). Multiplied along the block, the bonuses held every position at its
    upper bound at once (one request at tau 8.2: s_12 to s_15 chosen by at 0.43 to 0.37 where the plans expected 0.29
    to 0.24, k = 15 in 65% to 80% of the steps where k = 11 ran 5% faster). With the first position's count for every
    position, a position that plans stopped reaching kept its stale estimate at the first's small error: on the demo
    pair one request at a time, plans drafted 1 in 556 of 584 steps, never reaching the second position again."""
    chances, bound, chance = [], 1.0, 1.0
    total = along = 0.0  # the variance of the summed log bonuses, and their sum as correlated with position i's
    before = -1.0  # the variance of the position before's estimate (none before the first)
    for p, count in zip(run, reached, strict=True):
        spread = p * (1 - p)
        kept = PRIOR_WEIGHT / (count + PRIOR_WEIGHT)  # the prior's share in this estimate
        prior = spread / PRIOR_WEIGHT if before < 0 else before
        variance = kept * kept * prior + count * spread / (count + PRIOR_WEIGHT) ** 2
        share = kept * math.sqrt(before / variance) if before > 0 and variance > 0 else 0.0
        before = variance
        step = math.log1p(bonus * math.sqrt(variance) / max(p, 1e-12))
        along = step + share * along
        total += 2 * step * along - step**2
        chance *= p
        upper = min(chance * math.exp(math.sqrt(total)), bound)  # never above the position before
        chances.append(upper / bound)
        bound = upper
    return chances

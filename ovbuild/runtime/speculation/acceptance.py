"""Acceptance statistics: per draft position, the verifications of a request (or of the whole run) that reached it and
those that accepted it, and how much a request's own record counts against the run's (empirical Bayes)."""

from __future__ import annotations

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
        """One verification: positions 0..accepted were reached (up to `proposed`), the first `accepted` kept."""
        self.reached *= decay
        self.accepted *= decay
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

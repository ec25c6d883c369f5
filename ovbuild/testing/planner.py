"""A draft-length planner with fixed call costs, so that adaptive speculation makes the same plans on every machine
and in every run: tests that assert what was drafted or accepted must not depend on how busy the CPU was."""

from __future__ import annotations

import numpy as np

from ovbuild.runtime.speculation.acceptance import AcceptanceStats
from ovbuild.runtime.speculation.call_cost import BUCKETS, CallCost
from ovbuild.runtime.speculation.drafters.base import Drafter
from ovbuild.runtime.speculation.planner import Speculation


def accepting(rates: list[float], weight: float = 1000.0) -> AcceptanceStats:
    """The acceptance statistics of a request that accepted position j at rate rates[j], seen `weight` times."""
    stats = AcceptanceStats.empty(len(rates))
    stats.reached[:] = weight
    stats.accepted[:] = weight * np.array(rates)
    return stats


def fixed_cost(seconds_per_call: float, seconds_per_row: float) -> CallCost:
    """A cost model that every bucket already knows and that calls do not move (window 0)."""
    cost = CallCost(window=0)
    for rows in BUCKETS:
        cost.observe(int(rows), seconds_per_call + seconds_per_row * rows)
    return cost


def fixed_curve(seconds_by_rows: dict[int, float]) -> CallCost:
    """A cost model that knows these calls (rows: seconds, rows among call_cost.BUCKETS) and that calls do not move:
    linear between them."""
    cost = CallCost(window=0)
    for rows, seconds in sorted(seconds_by_rows.items()):
        cost.observe(rows, seconds)
    return cost


def fixed_speculation(
    drafter: Drafter | None,
    target: tuple[float, float] = (1e-3, 1e-5),
    draft: tuple[float, float] = (1e-4, 1e-5),
    host_s: float = 1e-4,
) -> Speculation | None:
    """A planner for `drafter` whose costs never change: (seconds per call, seconds per row) of each model and the
    host's seconds per step. The defaults are a memory-bound target and a cheap draft, where drafting pays as soon
    as the draft is often right (it is calibrated already, so no timed calls run either). None for no drafter (the
    target alone plans nothing), as the Scheduler takes it."""
    if drafter is None:
        return None
    return Speculation(
        drafter.max_candidates,
        drafter.candidate_offset,
        fixed_cost(*target),
        fixed_cost(*draft),
        host_s=host_s,
        learn_host=False,
    )

"""Host time per step: the seconds a scheduling step spends outside its model calls, kept by the kind of step (with
or without a draft call) and by the requests in it, for the planner to charge its plans
(ovbuild.runtime.speculation.planner)."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

HOST_WINDOW = 15  # recent steps whose median host time plans are charged, per kind of step and request count


@dataclass
class HostTimes:
    """The host seconds of the recent steps without and with a draft call, by the requests in the step (HOST_WINDOW
    of each)."""

    plain: dict[int, deque[float]] = field(default_factory=dict)
    drafting: dict[int, deque[float]] = field(default_factory=dict)

    def observe(self, seconds: float, drafted: bool, requests: int) -> None:
        """One step's host seconds; `drafted`: it made a draft call; `requests`: in the step."""
        table = self.drafting if drafted else self.plain
        window = table.get(max(requests, 1))
        if window is None:  # not setdefault: its default would be built every step
            window = table[max(requests, 1)] = deque(maxlen=HOST_WINDOW)
        window.append(seconds)

    def costs(self, requests: int, draft_host_s: float) -> tuple[float, float] | None:
        """(host seconds of a step of `requests` requests without a draft call, what a draft call adds to them), from
        the steps of the nearest request count measured; what a draft call adds is `draft_host_s` until a drafting
        step is seen. None before any step without a draft call.

        By request count: a host time kept for the run as a whole charged single requests, after a burst of 12 at
        once, the burst's 1.2 ms a drafting step where theirs took 0.1 ms (docs/speed.md). Medians of the recent
        steps, not averages: host time has spikes (a garbage collection, a first call's allocations), and one of 16 ms
        in a 4-request run's first drafting step on a Qwen3-4B-shaped pair, averaged in where such steps took 1 to 2
        ms, was charged to every later plan and kept that run from drafting again."""
        if not self.plain:
            return None
        plain = _median(self.plain[_nearest(self.plain, requests)])
        if not self.drafting:
            return plain, draft_host_s
        measured = _nearest(self.drafting, requests)
        base = _median(self.plain[_nearest(self.plain, measured)])
        return plain, max(_median(self.drafting[measured]) - base, 0.0)


def _nearest(table: dict[int, object], requests: int) -> int:
    """The key of `table` nearest `requests` on a log scale (the fewer requests on a tie)."""
    return min(table, key=lambda n: (abs(math.log(n / max(requests, 1))), n))


def _median(values: deque[float]) -> float:
    """The median of `values`; of an even count the lower middle one (of two values, one a spike: the other)."""
    return sorted(values)[(len(values) - 1) // 2]

"""Call costs: seconds one model call takes as a function of its rows, kept per row bucket from measured calls."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable

import numpy as np

# Row counts at which call times are kept: about 1.5x apart, up to a large prefill.
BUCKETS = np.array([1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048])
# A call's bucket is the nearest on a log scale: the edges are the geometric means of neighbouring buckets.
_BUCKET_EDGES = [float(np.sqrt(a * b)) for a, b in itertools.pairwise(BUCKETS)]


def bucket(rows: int) -> int:
    """Index of the bucket nearest `rows` (on a log scale)."""
    return bisect.bisect_left(_BUCKET_EDGES, rows)


# A row bucket without a call among its model's last PHASE_CALLS calls describes another phase of the run (one request
# at a time, then four at once; a busy machine, then a quiet one): its next call starts it afresh, and while two or more
# buckets have recent calls the curve is fitted to those and to older ones of more rows
# (ovbuild.runtime.speculation.planner also times an outdated plain step before drafting against it).
PHASE_CALLS = 128


class CallCost:
    """Seconds one call takes as a function of its rows. Per row bucket: the median of the recent calls (robust to a
    shared machine's spikes; of an even count the lower middle one, so that a bucket of two calls, one of them a
    spike, is not set by the spike: on the demo pair a 4-row bucket of 3.6 and 10.4 ms made 4 target rows look as
    dear as 12, and 4 requests at once drafted in every step); made non-decreasing in rows by pooling neighbouring
    buckets that disagree, each weighted by its calls; interpolated between buckets, extrapolated linearly beyond the
    last; buckets of another phase of the run left out (PHASE_CALLS).

    The median, not a low quantile, and pooling, not capping each bucket by the larger ones: a lucky fast call in the
    8-row bucket used to flatten the whole curve, so that 8 verification rows looked as cheap as 1 and the demo pair
    drafted full blocks where 4 tokens were measured faster."""

    def __init__(self, window: int = 16, computed: Callable[[int], int] | None = None):
        """window: recent calls kept per bucket (0: keep the first one seen, for fixed costs in tests); computed: the
        rows a call of any row count computes (a static copy's row count, PagedModel.computed_rows), by which calls are
        kept and priced: a 13-row call runs in the 16-row copy, and kept as 13 rows (the 12-row bucket) it made 13
        rows look dearer than 12 and 14 to 16 rows dearer than 13, where they are free."""
        self.window = window
        self.computed = computed
        # computed for every row count up to the largest bucket, looked up: a plan prices about 30 row counts per
        # curve, and calling `computed` for each made a 4-request plan 1.4x as long (63 against 45 us)
        self._computed = None if computed is None else np.array([computed(r) for r in range(int(BUCKETS[-1]) + 1)])
        self.recent: list[list[tuple[int, float]]] = [[] for _ in BUCKETS]
        self.rows = np.zeros(len(BUCKETS))  # rows and seconds of each bucket's estimate
        self.seconds = np.zeros(len(BUCKETS))
        self.seen = np.zeros(len(BUCKETS), bool)
        self.calls = 0  # calls observed so far, and the count at each bucket's last one
        self.last = np.zeros(len(BUCKETS), np.int64)
        self._stale: set[int] = set()  # buckets with calls not yet in their median (taken when a plan asks)
        self._fit: tuple[np.ndarray, np.ndarray] | None = None  # (rows, seconds) of the monotone curve, when current

    @property
    def calibrated(self) -> bool:
        return int(self.seen.sum()) >= 2

    def observe(self, rows: int, seconds: float) -> None:
        """Fold one call's time into the bucket nearest its row count."""
        if rows <= 0:
            return
        rows = self._rows(rows)
        b = bucket(rows)
        recent = self.recent[b]  # plain Python: every model call lands here, right after it (cold caches)
        if not recent:
            self.seen[b] = True
        elif self.window == 0:
            return
        self.calls += 1
        if self.calls - self.last[b] > PHASE_CALLS:
            recent.clear()  # its calls are from another phase of the run
        self.last[b] = self.calls
        recent.append((rows, seconds))
        if len(recent) > max(self.window, 1):
            del recent[0]
        self._stale.add(b)
        self._fit = None

    def fastest(self, rows: int) -> float:
        """The fastest recent call in the bucket nearest `rows` (nan if none): the floor a benchmark compares with."""
        recent = self.recent[bucket(self._rows(rows))]
        return min((seconds for _, seconds in recent), default=float("nan"))

    def outdated(self, rows: int) -> bool:
        """Whether the bucket nearest `rows` has calls, none of them among the last PHASE_CALLS."""
        b = bucket(self._rows(rows))
        return bool(self.seen[b] and self.window and self.calls - self.last[b] > PHASE_CALLS)

    def _rows(self, rows: int) -> int:
        """The rows a call of `rows` rows computes (`computed`; as asked without it, or beyond the largest bucket)."""
        table = self._computed
        return rows if table is None or rows >= len(table) else int(table[rows])

    def __call__(self, rows: np.ndarray | int) -> np.ndarray:
        """Predicted seconds for calls of `rows` rows: [N] -> [N]."""
        if self._fit is None:
            for b in self._stale:
                recent = self.recent[b]
                middle = (len(recent) - 1) // 2  # the median call; of an even count the lower middle one
                self.rows[b], self.seconds[b] = sorted(recent, key=lambda call: call[1])[middle]
            self._stale.clear()
            current = self.seen & (self.calls - self.last <= PHASE_CALLS) if self.window else self.seen
            # outdated buckets above the current ones stay: without them the curve would extend the current ones'
            # slope to row counts no recent call ran (16 requests at once, not drafting, then priced their
            # verification rows from 12 and 16 rows alone, and drafted at 0.86x)
            use = self.seen
            if current.sum() >= 2:
                use = self.seen & (current | (BUCKETS[current].max() < BUCKETS))
            calls = np.array([len(r) for r in self.recent], np.float64)[use]
            self._fit = self.rows[use], _monotone(self.seconds[use], np.maximum(calls, 1))
        if self._computed is not None:
            rows = np.asarray(rows, np.int64)
            rows = np.where(rows < len(self._computed), self._computed[np.minimum(rows, len(self._computed) - 1)], rows)
        x, y = self._fit  # buckets in increasing rows
        if len(x) == 0:
            return np.zeros(np.shape(rows))
        if len(x) == 1:
            return y[0] * np.maximum(np.asarray(rows, np.float64), 1) / x[0]
        slope = max((y[-1] - y[-2]) / max(x[-1] - x[-2], 1e-9), 0.0)
        rows = np.asarray(rows, np.float64)
        return np.where(rows > x[-1], y[-1] + slope * (rows - x[-1]), np.interp(rows, x, y))


def _monotone(y: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """The closest non-decreasing sequence to y in weighted least squares (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [mean, weight, count] of each pooled run
    for value, w in zip(y.tolist(), weight.tolist(), strict=True):
        blocks.append([value, w, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m2, w2, n2), (m1, w1, n1) = blocks.pop(), blocks.pop()
            blocks.append([(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, n1 + n2])
    return np.array([m for m, _, n in blocks for _ in range(n)])

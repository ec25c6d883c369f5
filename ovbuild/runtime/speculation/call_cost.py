"""Call costs: seconds one model call takes as a function of its rows, kept per row bucket from measured calls."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Iterable

import numpy as np

# Row counts at which call times are kept: about 1.5x apart, up to a large prefill.
BUCKETS = np.array([1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048])
# A call's bucket is the nearest on a log scale: the edges are the geometric means of neighbouring buckets.
_BUCKET_EDGES = [float(np.sqrt(a * b)) for a, b in itertools.pairwise(BUCKETS)]


def bucket(rows: int) -> int:
    """Index of the bucket nearest `rows` (on a log scale)."""
    return bisect.bisect_left(_BUCKET_EDGES, rows)


# A row bucket without a call among its model's last PHASE_CALLS calls is outdated: the planner times an outdated plain
# step before drafting against it (ovbuild.runtime.speculation.planner). It stays in the curve, scaled by the drift.
PHASE_CALLS = 128
# How fast the drift follows the calls: each call moves it by this share of the log of (its time / its bucket's
# reference at today's drift), that ratio clipped to DRIFT_CLIP either way, so one spike moves every price by at most
# 1.5^0.15 = 6%, while a machine that got twice as slow (other work, heat) is followed within about 15 calls.
DRIFT_RATE = 0.15
# A bucket with a call among its model's last FRESH_CALLS calls (a draft's: its own and the target's) is priced at its
# own calls' median as it is: the drift is measured against references that may come from another moment (a calibration
# kept from a busy run), and scaling such buckets by it priced the 16-row calls of a Qwen3-4B-sized pair 11% (target)
# and 38% (draft) under their own median, which leans towards long drafts. The drift itself moves with the mix of row
# counts being called (each bucket's reference errs its own way: the calibration keeps each row count's fastest call),
# so with 32 calls the buckets a planner left for a while were still mispriced: one request at a time at tau 8.2, the
# 12-row target bucket at 12% over its median and the 24-row draft bucket at 23% under, kinks in the curve that drew
# the plans to full blocks of 15. A bucket is now priced at its own median while its last call is among the last
# PHASE_CALLS, as long as a plan trusts a bucket at all (see outdated).
FRESH_CALLS = PHASE_CALLS
DRIFT_CLIP = 1.5
FOLD_AFTER = 64  # calls observed at most before they are folded in (see CallCost.observe)
# Row counts priced in one go from which numpy interpolates them: a plan prices every proposal count of its requests
# (257 row counts per curve at 16 requests of 16 proposals), which took ~55 us a curve in plain Python against ~15 us
# in numpy, while a few row counts cost numpy more than Python (see CallCost.__init__).
NUMPY_PRICES = 48


class CallCost:
    """Seconds one call takes as a function of its rows, kept per row bucket, and a drift: how much slower or faster
    than at the calibration the machine runs now.

    Per bucket: the median of its recent calls (robust to a shared machine's spikes; of an even count the lower middle
    one, so that a bucket of two calls, one of them a spike, is not set by the spike), times the drift since the
    bucket's last call when that is older than FRESH_CALLS calls: a bucket no recent call ran is priced at today's
    speed, not at that of the moment it was last called. Made non-decreasing in rows by pooling neighbouring buckets
    that disagree, each weighted by its calls;
    interpolated between buckets, extrapolated linearly beyond the last. Every bucket ever seen stays in the curve:
    leaving out the buckets of another phase of the run (as this did until the drift replaced it) priced every row
    count below the current ones at the smallest current one, so that a planner drafting 15 saw 8 rows cost as much
    as 16 and kept drafting 15.

    The drift: each call's time over its bucket's reference (its first call, at the drift of then: the calibration's
    for the calibrated buckets), folded into a running factor (DRIFT_RATE, DRIFT_CLIP). Measured against a fixed
    reference, not the bucket's own median, which the calls themselves move. `follows`: another model's cost (the
    draft's follows the target's); the drift is then this one's own times that one's, so a draft that is not called
    while nobody drafts is priced at the machine's present speed, not at that of a busy moment that made drafting
    look dear."""

    def __init__(
        self,
        window: int = 16,
        computed: Callable[[int], int] | None = None,
        follows: CallCost | None = None,
        drift_rate: float = DRIFT_RATE,
    ):
        """window: recent calls kept per bucket (0: keep the first one seen and never drift, for fixed costs in
        tests); computed: the rows a call of any row count computes (a static copy's row count,
        PagedModel.computed_rows), by which calls are kept and priced: a 13-row call runs in the 16-row copy, and kept
        as 13 rows (the 12-row bucket) it made 13 rows look dearer than 12 and 14 to 16 rows dearer than 13, where
        they are free; follows: the cost whose drift this one's is relative to; drift_rate: DRIFT_RATE (0: the
        drift stays 1)."""
        self.window, self.drift_rate = window, drift_rate
        self.computed = computed
        self.follows = follows
        # Plain Python lists, not numpy arrays: every model call is observed right after it runs (cold caches), and a
        # plan prices about 30 row counts per curve; with numpy scalars and arrays a 1-request plan took ~180 us on a
        # small pair, against ~350 us for its target call. computed is looked up for every row count up to the largest
        # bucket (calling it for each made a 4-request plan 1.4x as long).
        self._computed = None if computed is None else [int(computed(r)) for r in range(int(BUCKETS[-1]) + 1)]
        self._computed_array = None if computed is None else np.array(self._computed, dtype=np.float64)
        buckets = len(BUCKETS)
        self._recent: list[list[tuple[int, float]]] = [[] for _ in range(buckets)]  # per bucket (see recent)
        self.median: list[tuple[int, float]] = [(0, 0.0)] * buckets  # (rows, seconds) of each bucket's median call
        self.reference = [0.0] * buckets  # each bucket's first call, over the drift of then
        self.drift_then = [1.0] * buckets  # the drift at each bucket's last call
        self.clock_then = [0] * buckets  # and the clock
        self.own_drift = 1.0  # this model's drift (relative to `follows`' when it follows one)
        self.calls = 0  # calls observed so far, and the count at each bucket's last one
        self.last = [0] * buckets
        self._stale: set[int] = set()  # buckets with calls not yet in their median (taken when a plan asks)
        self._unfolded: list[tuple[int, float]] = []  # calls observed, not yet folded in (see observe)
        # rows, seconds, slope beyond the last and drift of the monotone curve (_curve)
        self._fit: tuple[list[float], list[float], float, float] | None = None

    @property
    def recent(self) -> list[list[tuple[int, float]]]:
        """Per bucket, its recent calls: (rows computed, seconds), oldest first."""
        self._fold()
        return self._recent

    @property
    def seen(self) -> np.ndarray:
        """[buckets] whether each bucket has a call."""
        self._fold()
        return np.array([bool(recent) for recent in self._recent])

    @property
    def calibrated(self) -> bool:
        self._fold()
        return sum(1 for recent in self._recent if recent) >= 2

    @property
    def clock(self) -> int:
        """Calls of this model and of the one it follows: a follower's bucket ages while only the other one runs."""
        self._fold()
        return self.calls + (self.follows.clock if self.follows is not None else 0)

    @property
    def drift(self) -> float:
        """How many times its calibration's time a call takes now (the followed model's drift included)."""
        self._fold()
        return self.own_drift * (self.follows.drift if self.follows is not None else 1.0)

    def observe(self, rows: int, seconds: float) -> None:
        """Keep one call's time, folded into the curve and the drift when they are next read. Every model call is
        observed right after it ran, on caches its kernels left cold, where folding it took ~4 us a call on a small
        pair (1% of its 0.35 ms steps); folded in bulk when a plan reads the costs (every 32nd step while nobody
        drafts), each call costs a fraction of that. At most FOLD_AFTER calls wait."""
        self._unfolded.append((rows, seconds))
        if len(self._unfolded) >= FOLD_AFTER:
            self._fold()

    def _fold(self) -> None:
        """Fold the calls observed since the last fold into the drift and into the bucket nearest each call's rows, in
        their order. One loop over locals, not a method call per call: a plan folds the ~90 target calls since the
        last one, and at ~1 us a call that was 1% of a 0.35 ms step on the losing pair (bench_runtime.py --losing)."""
        if not self._unfolded:
            return
        calls, self._unfolded = self._unfolded, []
        # the followed model's drift and clock, which folding this model's calls leaves as they are
        other_drift, other_clock = (self.follows.drift, self.follows.clock) if self.follows is not None else (1.0, 0)
        table, window, rate = self._computed, self.window, self.drift_rate
        own, count, keep = self.own_drift, self.calls, max(self.window, 1)
        for rows, seconds in calls:
            if rows <= 0:
                continue
            if table is not None and rows < len(table):
                rows = table[int(rows)]  # _rows: kept at the rows the call computes
            b = bisect.bisect_left(_BUCKET_EDGES, rows)  # bucket(rows)
            recent = self._recent[b]
            if not recent:
                self.reference[b] = seconds / (own * other_drift)
            elif window == 0:
                continue
            elif rate and seconds > 0:
                expected = self.reference[b] * (own * other_drift)
                ratio = min(max(seconds / expected, 1 / DRIFT_CLIP), DRIFT_CLIP) if expected > 0 else 1.0
                own *= ratio**rate
            count += 1
            self.last[b] = count
            self.drift_then[b] = own * other_drift
            self.clock_then[b] = count + other_clock
            recent.append((rows, seconds))
            if len(recent) > keep:
                del recent[0]
            self._stale.add(b)
        if count != self.calls:  # a call was kept
            self.own_drift, self.calls, self._fit = own, count, None

    def fastest(self, rows: int) -> float:
        """The fastest recent call in the bucket nearest `rows` (nan if none): the floor a benchmark compares with."""
        self._fold()
        recent = self._recent[bucket(self._rows(rows))]
        return min((seconds for _, seconds in recent), default=float("nan"))

    def outdated(self, rows: int) -> bool:
        """Whether the bucket nearest `rows` has calls, none of them among the last PHASE_CALLS."""
        self._fold()
        b = bucket(self._rows(rows))
        return bool(self._recent[b] and self.window and self.calls - self.last[b] > PHASE_CALLS)

    def _rows(self, rows: int) -> int:
        """The rows a call of `rows` rows computes (`computed`; as asked without it, or beyond the largest bucket)."""
        table = self._computed
        return rows if table is None or rows >= len(table) else table[int(rows)]

    def __call__(self, rows: np.ndarray | int) -> np.ndarray:
        """Predicted seconds for calls of `rows` rows now: [N] -> [N]."""
        shape = np.shape(rows)
        return np.array(self.prices(np.ravel(rows).tolist())).reshape(shape)

    def prices(self, rows: Iterable[float]) -> list[float]:
        """Predicted seconds for calls of each of `rows` rows now (__call__ in plain Python, for the planner)."""
        x, y, slope, _ = self._curve()
        table = self._computed
        rows = rows if isinstance(rows, list | range) else list(rows)
        if len(rows) >= NUMPY_PRICES and len(x) >= 2:
            return self._prices_at_once(rows, x, y, slope)
        prices = []
        for r in rows:
            if table is not None:
                r = int(r)  # a whole call's rows (a plan's expected context rows are fractional)
                r = table[r] if r < len(table) else r  # _rows, inlined: a plan prices ~100 row counts
            if len(x) < 2:
                prices.append(y[0] * max(r, 1) / x[0] if x else 0.0)
            elif r > x[-1]:
                prices.append(y[-1] + slope * (r - x[-1]))
            elif r <= x[0]:
                prices.append(y[0])
            else:
                i = bisect.bisect_left(x, r)  # x[i - 1] < r <= x[i]
                share = (r - x[i - 1]) / (x[i] - x[i - 1])
                prices.append(y[i - 1] + share * (y[i] - y[i - 1]))
        return prices

    def _prices_at_once(self, rows: list[float] | range, x: list[float], y: list[float], slope: float) -> list[float]:
        """prices of many row counts at once, in numpy (see NUMPY_PRICES)."""
        r = np.asarray(rows, dtype=np.float64)
        table = self._computed_array
        if table is not None:  # _rows, as in prices: a whole call's rows, then the rows it computes
            r = np.trunc(r)
            inside = r < len(table)
            r[inside] = table[r[inside].astype(np.int64)]
        x_, y_ = np.asarray(x), np.asarray(y)
        i = np.clip(np.searchsorted(x_, r), 1, len(x) - 1)  # x[i - 1] < r <= x[i] inside the curve
        share = (r - x_[i - 1]) / (x_[i] - x_[i - 1])
        inner = y_[i - 1] + share * (y_[i] - y_[i - 1])  # prices' arithmetic, in its order: bitwise its prices
        beyond = y_[-1] + slope * (r - x_[-1])
        return np.where(r > x_[-1], beyond, np.where(r <= x_[0], y_[0], inner)).tolist()

    def _curve(self) -> tuple[list[float], list[float], float, float]:
        """(rows, seconds, slope beyond the last, drift) of the curve now: each bucket with calls at its median call
        (at today's speed when no recent call ran it), made non-decreasing; refitted when a call or the drift moved."""
        drift = self.drift
        if self._fit is not None and self._fit[3] == drift:
            return self._fit
        for b in self._stale:
            recent = self._recent[b]
            middle = (len(recent) - 1) // 2  # the median call; of an even count the lower middle one
            self.median[b] = sorted(recent, key=lambda call: call[1])[middle]
        self._stale.clear()
        clock, x, now, calls = self.clock, [], [], []
        for b, recent in enumerate(self._recent):
            if recent:
                rows, seconds = self.median[b]
                # a bucket with recent calls at their median; one without, at today's speed (the drift since its last)
                fresh = clock - self.clock_then[b] <= FRESH_CALLS
                x.append(float(rows))
                now.append(seconds if fresh else seconds * drift / self.drift_then[b])
                calls.append(max(len(recent), 1))
        y = _monotone(now, calls)
        slope = max((y[-1] - y[-2]) / max(x[-1] - x[-2], 1e-9), 0.0) if len(x) > 1 else 0.0
        self._fit = x, y, slope, drift
        return self._fit


def _monotone(y: list[float], weight: list[int]) -> list[float]:
    """The closest non-decreasing sequence to y in weighted least squares (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [mean, weight, count] of each pooled run
    for value, w in zip(y, weight, strict=True):
        blocks.append([value, w, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m2, w2, n2), (m1, w1, n1) = blocks.pop(), blocks.pop()
            blocks.append([(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, n1 + n2])
    return [m for m, _, n in blocks for _ in range(n)]

"""Call costs (ovbuild.runtime.speculation.call_cost): the curve a planner prices calls by, from measured calls: a
shape per row bucket times a drift that follows the machine."""

from __future__ import annotations

import numpy as np
import pytest

from ovbuild.runtime.model.static_rows import padded_rows
from ovbuild.runtime.speculation.call_cost import (
    DRIFT_CLIP,
    DRIFT_RATE,
    FOLD_AFTER,
    FRESH_CALLS,
    NUMPY_PRICES,
    CallCost,
)


def test_call_cost_interpolates_extrapolates_and_resists_spikes():
    """The shape alone (drift off): interpolated, extrapolated, each bucket its median call, made non-decreasing."""
    cost = CallCost(drift_rate=0)
    cost.observe(1, 1.0)
    cost.observe(8, 2.0)
    assert cost(np.array([1, 4.5, 8, 15])) == pytest.approx([1.0, 1.5, 2.0, 3.0])
    # bucket 8 holds 2, 4, 3, 40: its estimate is the median call, the lower of the middle two, spike or not
    for seconds in (4.0, 3.0, 40.0):
        cost.observe(8, seconds)
    assert cost(8) == pytest.approx(3.0) and cost.fastest(8) == 2.0
    # a spike on a smaller bucket, seen once: pooled with the larger bucket's four calls, so more rows never look
    # cheaper and one call does not outweigh four
    cost.observe(4, 9.0)
    assert cost(4) == pytest.approx((9.0 + 4 * 3.0) / 5) == cost(8) and cost(2) <= cost(4)
    cost.observe(4, 2.0)  # with a second call, the spike is the upper of two: the bucket's estimate is the other
    assert cost(4) == pytest.approx(2.0)
    for _ in range(16):  # a lucky fast call in a large bucket no longer flattens the smaller ones
        cost.observe(1, 1.0)
        cost.observe(4, 2.5)
    cost.observe(16, 0.5)
    assert cost(1) < cost(4) <= cost(16)


def calibrated() -> CallCost:
    """A cost calibrated at 1, 4, 8 and 16 rows: 0.4, 0.6, 0.72 and 1.09 s (a compute-bound Qwen3-4B-sized target)."""
    cost = CallCost()
    for rows, seconds in ((1, 0.4), (4, 0.6), (8, 0.72), (16, 1.09)):
        cost.observe(rows, seconds)
    return cost


def test_buckets_no_call_ran_lately_keep_their_place_in_the_curve():
    """A planner that drafts 15 for many steps calls only 16 rows: the smaller buckets must keep their shape. Left
    out of the curve (as buckets of 'another phase' were), every row count below 16 cost what 16 did, so drafting 7
    looked no cheaper than drafting 15 and the planner kept drafting 15."""
    cost = calibrated()
    for _ in range(300):
        cost.observe(16, 1.09)
    assert cost(np.array([1, 8, 16])) == pytest.approx([0.4, 0.72, 1.09], rel=1e-6)


def test_the_drift_follows_a_machine_that_slows_down_and_recovers():
    """Calls of one row count at twice their time (other work on the machine): every row count's price follows
    within about 15 calls, without a call of its own (priced so once a bucket's last call is FRESH_CALLS old), and
    comes back when the machine does. Expected: each call moves
    the drift by min(ratio, DRIFT_CLIP)^DRIFT_RATE, so the drift after n calls at ratio 2 is found by iterating that
    map by hand, and a single spike moves it by at most DRIFT_CLIP^DRIFT_RATE."""
    cost = calibrated()
    drift = 1.0
    for _ in range(FRESH_CALLS + 1):
        cost.observe(16, 2 * 1.09)
        drift *= min(2 / drift, DRIFT_CLIP) ** DRIFT_RATE
    assert drift > 1.95 and cost.drift == pytest.approx(drift, rel=1e-9)
    # buckets 1 and 8 had no call among the last FRESH_CALLS: priced at their calls times the drift since
    assert cost(np.array([1, 8])) == pytest.approx([0.4 * drift, 0.72 * drift], rel=0.01)
    assert cost(16) == pytest.approx(2 * 1.09), "a bucket with recent calls: their median, as it is"
    for _ in range(40):
        cost.observe(16, 1.09)
    assert cost(8) == pytest.approx(0.72, rel=0.05), "back to the calibrated price once the machine is"
    before = cost.drift
    cost.observe(16, 50 * 1.09)  # one spike
    assert cost.drift / before <= DRIFT_CLIP**DRIFT_RATE + 1e-12


def test_a_draft_not_called_is_priced_at_the_machines_present_speed():
    """The draft's cost follows the target's drift: a busy moment that made drafting dear while it drafted (and then
    it stopped drafting, so no draft call moves its price) passes once the target's calls, made every step, run at
    their old speed again, once the draft's buckets have had no call among the last FRESH_CALLS (until then they are
    priced at their own calls)."""
    target = calibrated()
    draft = CallCost(follows=target)
    for rows, seconds in ((1, 0.03), (8, 0.1), (16, 0.26)):
        draft.observe(rows, seconds)
    for _ in range(30):  # a busy moment: both models' calls take twice as long
        target.observe(16, 2 * 1.09)
        draft.observe(8, 2 * 0.1)
    assert draft(8) > 1.8 * 0.1
    for _ in range(FRESH_CALLS + 30):  # the machine is quiet again; nobody drafts
        target.observe(1, 0.4)
    assert draft(8) == pytest.approx(0.1, rel=0.1) and draft(16) == pytest.approx(0.26, rel=0.1)


def test_a_call_is_kept_and_priced_at_the_rows_it_computes():
    """With static copies a call runs padded up to its copy's rows: 13 rows cost what 16 do. Kept as 13 rows, its time
    would land in the 12-row bucket, and 14 to 16 rows would look dearer than 13, where they are free."""
    cost = CallCost(computed=padded_rows, drift_rate=0)
    cost.observe(12, 1.5)
    cost.observe(13, 2.0)  # ran in the 16-row copy
    cost.observe(24, 3.0)
    assert cost(np.array([12, 13, 14, 16])) == pytest.approx([1.5, 2.0, 2.0, 2.0])
    assert cost.fastest(15) == 2.0 and cost.fastest(11) == 1.5
    plain = CallCost(drift_rate=0)
    plain.observe(12, 1.5)
    plain.observe(13, 2.0)
    assert plain.seen.sum() == 1 and plain(12) == pytest.approx(1.5), "without copies: kept as requested (12 and 13)"


def test_calls_wait_to_be_folded_in_but_never_many():
    """Calls are folded in when the costs are next read, in their order, as if each had been folded at once; a cost
    that nobody reads (every draft length pinned) keeps at most FOLD_AFTER of them waiting."""
    lazy, eager = calibrated(), calibrated()
    drifts = []
    for i in range(2 * FOLD_AFTER + 5):
        lazy.observe(16, 1.09 * (1 + (i % 7) / 10))
        eager.observe(16, 1.09 * (1 + (i % 7) / 10))
        drifts.append(eager.drift)  # read: folded at once
        assert len(lazy._unfolded) < FOLD_AFTER
    assert len(set(drifts)) > 7, "the calls moved the drift"
    assert lazy.drift == eager.drift and lazy(np.array([1, 8, 16])).tolist() == eager(np.array([1, 8, 16])).tolist()


def test_many_row_counts_are_priced_as_one_at_a_time():
    """A plan prices hundreds of row counts at once (in numpy from NUMPY_PRICES on): bitwise the prices of each row
    count asked alone, padded to its copy's rows or not, fractional rows among them, inside and beyond the curve."""
    rng = np.random.default_rng(0)
    for computed in (padded_rows, None):
        cost = CallCost(computed=computed)
        for rows, seconds in ((1, 3e-4), (2, 3.1e-4), (4, 3.5e-4), (8, 4e-4), (16, 6e-4), (64, 1.7e-3), (128, 3e-3)):
            cost.observe(rows, seconds)
        rows = [*range(3 * NUMPY_PRICES), *rng.uniform(0, 3000, NUMPY_PRICES).tolist()]
        assert cost.prices(rows) == [cost.prices([r])[0] for r in rows]

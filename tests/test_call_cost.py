"""Call costs (ovbuild.runtime.speculation.call_cost): the curve a planner prices calls by, from measured calls."""

from __future__ import annotations

import numpy as np
import pytest

from ovbuild.runtime.model.static_rows import padded_rows
from ovbuild.runtime.speculation.call_cost import PHASE_CALLS, CallCost


def test_call_cost_interpolates_extrapolates_and_resists_spikes():
    cost = CallCost()
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


def test_call_cost_leaves_out_buckets_of_another_phase():
    """Calls of one phase of a run (one request at a time) must not price the next (four at once): a bucket with no
    call among the last PHASE_CALLS starts afresh at its next call and, below the current buckets, stays out of the
    curve while two or more buckets are current."""
    cost = CallCost()
    for _ in range(3):  # the earlier phase: 4 rows looked dear
        cost.observe(4, 9.0)
    cost.observe(8, 9.5)
    cost.observe(48, 20.0)  # and so did 48 rows, which no call of the next phase runs
    for _ in range(PHASE_CALLS):
        cost.observe(16, 4.0)
        cost.observe(24, 5.0)
    assert cost.outdated(4) and cost.outdated(8) and not cost.outdated(16)
    assert cost(4) == pytest.approx(4.0), "the current buckets set the curve below them (flat below the first)"
    assert cost(48) == pytest.approx(20.0), "an older bucket of more rows is kept: the current slope would say 8"
    cost.observe(4, 2.0)
    assert not cost.outdated(4) and cost(4) == pytest.approx(2.0), "the old 9.0 is gone, not pooled"
    assert cost(8) == pytest.approx(2.0 + (4.0 - 2.0) * 4 / 12), "bucket 8, outdated, is left out"


def test_a_call_is_kept_and_priced_at_the_rows_it_computes():
    """With static copies a call runs padded up to its copy's rows: 13 rows cost what 16 do. Kept as 13 rows, its time
    would land in the 12-row bucket, and 14 to 16 rows would look dearer than 13, where they are free."""
    cost = CallCost(computed=padded_rows)
    cost.observe(12, 1.5)
    cost.observe(13, 2.0)  # ran in the 16-row copy
    cost.observe(24, 3.0)
    assert cost(np.array([12, 13, 14, 16])) == pytest.approx([1.5, 2.0, 2.0, 2.0])
    assert cost.fastest(15) == 2.0 and cost.fastest(11) == 1.5
    plain = CallCost()
    plain.observe(12, 1.5)
    plain.observe(13, 2.0)
    assert plain.seen.sum() == 1 and plain(12) == pytest.approx(1.5), "without copies: kept as requested (12 and 13)"

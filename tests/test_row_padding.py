"""Row padding: which row counts calls are padded to, and that a padded call returns the padding's cache blocks and
hands back only the real rows' taps (tests/test_paged_parity.py runs padded calls against the numpy reference)."""

from __future__ import annotations

import numpy as np

from ovbuild.graph.target import build_target
from ovbuild.runtime.cache.kv_cache import SequenceRows
from ovbuild.runtime.model.padding import LADDER, RowPadding, pad_inputs
from ovbuild.runtime.model.paged_model import PagedModel


def test_steady_row_counts_run_as_they_are():
    padding = RowPadding(16, 1.0)
    assert [padding.rows(4) for _ in range(10)] == [4] * 10


def test_varying_row_counts_share_the_ladder_step_above_the_largest_recent_one():
    padding = RowPadding(16, 1.0)
    padded = [padding.rows(r) for r in (6, 8, 5, 7, 8, 6)]
    assert padded[0] == 6  # nothing recent differs yet
    step = min(s for s in LADDER if s > 8)  # the largest recent count plus a padding row, at least
    assert padded[1:] == [step] * 5


def test_padding_stays_within_its_allowance():
    padding = RowPadding(2, 0.25)
    assert padding.rows(40) == 40
    assert padding.rows(8) == 8  # padding 8 rows up past 40 would add far more than max(2, 0.25 x 8)
    step = min(s for s in LADDER if s > 40)  # above the largest recent count, 40
    assert padding.rows(39) == step and step - 39 <= max(2, int(0.25 * 39))


def test_row_counts_beyond_the_ladder_are_not_padded():
    padding = RowPadding(16, 1.0)
    padding.rows(LADDER[-1] + 50)
    assert padding.rows(LADDER[-1] + 10) == LADDER[-1] + 10


def test_pad_inputs_appends_rows_to_per_row_inputs_only():
    inputs = {
        "input_ids": np.array([5, 6], np.int64),
        "position_ids": np.array([7, 8], np.int64),
        "hidden_states": np.ones((2, 3), np.float32),
        "logits_indices": np.array([0, 1], np.int64),
    }
    padded = pad_inputs(inputs, 3)
    assert padded["input_ids"].tolist() == [5, 6, 0, 0, 0]
    assert padded["position_ids"].tolist() == [7, 8, 0, 1, 2]  # the padding sequence starts at position 0
    assert padded["hidden_states"].shape == (5, 3) and not padded["hidden_states"][2:].any()
    assert padded["logits_indices"].tolist() == [0, 1]  # selects outputs, not a per-row input
    assert inputs["input_ids"].tolist() == [5, 6]  # the caller's arrays are left alone
    lists = {"input_ids": [5, 6], "position_ids": [7, 8], "logits_indices": [1]}
    padded = pad_inputs(lists, 2)
    # plain lists stay lists (the binder skips a list equal to the last call's) and the caller's are left alone
    assert padded == {"input_ids": [5, 6, 0, 0], "position_ids": [7, 8, 0, 1], "logits_indices": [1]}
    assert lists["input_ids"] == [5, 6]


def test_a_padded_call_returns_its_blocks_and_only_the_real_rows_taps(target):
    cfg, weights = target
    model = PagedModel(
        build_target(cfg, weights, (1, 3, 5)), kv_cache_precision="f32", padding=(16, 1.0), static_rows=False
    )
    allocator = model.cache.allocator
    allocator.reserve(0, 64)
    free = allocator.free_blocks
    for n in (6, 1):  # the second call differs from the first: it runs padded, to the ladder step above 6 + 1
        past = 0 if n == 6 else 6
        out = model.run(
            [SequenceRows(0, past, n)],
            {"input_ids": np.arange(n), "position_ids": np.arange(past, past + n), "logits_indices": np.arange(n)},
        )
        assert out["hidden_states"].shape[0] == n and out["logits"].shape[0] == n
        assert model.request.get_tensor("input_ids").shape[0] == (n if n == 6 else 8)  # 1 row padded to 8
        assert allocator.free_blocks == free and set(allocator.tables) == {0}
    assert model.executor.padding.recent == [6, 1]

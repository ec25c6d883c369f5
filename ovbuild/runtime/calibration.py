"""Timing a few calls of the target and the draft once, so that the first draft-length plan has call costs to go by
(they are then updated from every call the scheduler makes)."""

from __future__ import annotations

import numpy as np

from ovbuild.errors import CacheExhaustedError
from ovbuild.ir.ports import INPUT_IDS, LOGITS_INDICES, POSITION_IDS
from ovbuild.runtime.drafters.base import Drafter, DraftItem
from ovbuild.runtime.kv_cache import SequenceRows
from ovbuild.runtime.paged_model import PagedModel
from ovbuild.runtime.speculation import Speculation, timed

SCRATCH = -1  # the sequence id the timed calls write under; its blocks are freed right after


def calibrate(speculation: Speculation, target: PagedModel, drafter: Drafter) -> None:
    """Time calls of CALIBRATION_ROWS rows on each model, once per planner; when either cache lacks the blocks for
    it, the costs are learnt from the scheduler's own calls instead."""
    if speculation.calibrated or speculation.calibration_tried:
        return
    speculation.calibration_tried = True

    def target_call(rows: int) -> float:
        inputs = {
            INPUT_IDS: np.zeros(rows, np.int64),
            POSITION_IDS: np.arange(rows),
            LOGITS_INDICES: np.arange(rows),
        }
        # states reported after every row, as a verification call does (a hybrid target; else ignored)
        return timed(lambda: target.run([SequenceRows(SCRATCH, 0, rows)], inputs, [list(range(rows))]))

    def draft_call(rows: int) -> float:
        k = min(drafter.max_candidates, rows - drafter.candidate_offset)  # a block of k + offset rows, context the rest
        context_rows = rows - (k + drafter.candidate_offset if k > 0 else 0)
        context = np.zeros((context_rows, drafter.tap_width), np.float32) if context_rows else None
        item = DraftItem(SCRATCH, context, 0 if k > 0 else None, max(k, 0))
        seconds = timed(lambda: drafter.propose([item]))
        drafter.free(SCRATCH)
        return seconds

    try:
        speculation.calibrate(target_call, draft_call)
    except CacheExhaustedError:
        pass
    finally:
        target.free(SCRATCH)
        drafter.free(SCRATCH)

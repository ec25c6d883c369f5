"""Row padding: keeping a compiled model's row count from call to call.

The CPU plugin re-plans every node of a dynamic-shape model (shape inference, memory, kernel choice) when a call's row
count differs from the previous call's: on the demo target, a 1-row call costs 1.4x as much right after a 6-row call
as after another 1-row call (bench_row_padding.py, docs/speed.md). Speculative decoding changes row counts all the
time: a draft call carries each request's accepted rows, which vary every step, and the draft length decides the
verification rows.
So a draft call of fewer rows than a recent one runs padded up to that row count, when the padding is small: the padding
rows form a sequence of their own (their own cache blocks, taken from the free ones and returned after the call), which
no other sequence attends to and whose outputs nobody reads.
"""

from __future__ import annotations

import bisect

import numpy as np

from ovbuild.ir.ports import COUNT, ROW_INPUTS
from ovbuild.runtime.cache.kv_cache import SequenceRows

PAD_SEQUENCE = -2  # the sequence id padding rows run under (calibration's scratch sequence is -1)
# Row counts calls are padded to: about 1.25x apart, so that nearby row counts share one shape.
LADDER = (2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 40, 48, 64, 80, 96, 128, 160, 192, 256)
WINDOW = 8  # recent calls whose largest row count a call is padded to
# (min_pad, share) of a draft's RowPadding: its rows cost next to nothing at these sizes, while a change of row count
# costs a third of its call (bench_row_padding.py, docs/speed.md). A target's every row costs (on the demo target about
# a sixth of a change at 1 row), and it keeps its row count while the draft length does: targets run unpadded.
DRAFT_PADDING = (16, 1.0)


class RowPadding:
    """Chooses each call's padded row count from the row counts of the recent calls. A call of R rows takes at most
    max(min_pad, share x R) padding rows: a model whose extra rows cost little next to a re-planned call (a small
    draft) pads generously, a model whose every row costs (the target) pads little."""

    def __init__(self, min_pad: int, share: float):
        self.min_pad, self.share = min_pad, share
        self.recent: list[int] = []

    def rows(self, real: int) -> int:
        """Rows to run for a call of `real` rows. While the recent row counts are all `real`, just those; else the
        ladder step above the largest recent row count (one padding row at least, so that the padding sequence, and
        with it the sequence count, stays from call to call), if the padding is within the allowance."""
        self.recent.append(real)
        del self.recent[:-WINDOW]
        if all(r == real for r in self.recent):
            return real
        step = bisect.bisect_left(LADDER, max(self.recent) + 1)
        if step == len(LADDER):
            return real
        return LADDER[step] if LADDER[step] - real <= max(self.min_pad, int(self.share * real)) else real


def padding_rows(pad: int) -> SequenceRows:
    """The padding sequence's share of a call: `pad` rows from position 0."""
    return SequenceRows(PAD_SEQUENCE, 0, pad)


def pad_inputs(inputs: dict[str, np.ndarray], pad: int) -> dict[str, np.ndarray]:
    """`inputs` with `pad` rows appended to every per-row input (ovbuild.ir.ports.ROW_INPUTS), each filled as its
    port declares."""
    padded = dict(inputs)
    for port in ROW_INPUTS:
        if port not in inputs:
            continue
        value = inputs[port]
        if type(value) is list:
            # lists stay lists: the binder writes them straight into its buffers (ovbuild.runtime.model.binding)
            padded[port] = value + (list(range(pad)) if port.fill == COUNT else [port.fill] * pad)
            continue
        value = np.asarray(value)
        if port.fill == COUNT:
            fill = np.arange(pad, dtype=value.dtype)
        else:
            fill = np.full((pad, *value.shape[1:]), port.fill, value.dtype)
        padded[port] = np.concatenate([value, fill])
    return padded

"""Where the packed rows of a call sit on the [S, L] grid (sequence, step; L = the longest sequence of the call) on
which the linear-attention layers run their conv and recurrence; built once per graph, shared by every linear layer."""

from __future__ import annotations

from dataclasses import dataclass

import openvino as ov
import openvino.opset16 as ops

from ovbuild.graph.ops import Output, i64, named


@dataclass(frozen=True)
class StepGrid:
    """Where packed rows sit on the [S, L] grid of one call; built once, shared by every linear layer."""

    cells: Output  # [S, L] i64: packed row at (sequence, step); past a sequence's end, its last row again
    lengths: Output  # [S] i64: rows of each sequence (cells past them are not real)
    steps: Output  # [1] i64: L
    row_cells: Output  # [T, 2] i64: (sequence, step) of each packed row
    state_sequence: Output  # [Q] i64: sequence of each state row
    state_step: Output  # [Q] i64: its step


def step_grid(subsequence_begins: Output, state_rows: Output, rows_like: Output) -> StepGrid:
    """The grid of a call from subsequence_begins [S + 1] i32, state_rows [Q] i64 and any [T, ...] tensor."""
    begins = ops.convert(subsequence_begins, ov.Type.i64)
    starts = ops.slice(begins, i64([0]), i64([-1]), i64([1]), i64([0]))  # [S]
    ends = ops.slice(begins, i64([1]), i64([2**62]), i64([1]), i64([0]))  # [S]
    lengths = ops.subtract(ends, starts)  # [S]
    steps = ops.reduce_max(lengths, i64([0]), True)  # [1]
    step = ops.range(i64(0), ops.squeeze(steps, i64([0])), i64(1), ov.Type.i64)  # [L]
    last = ops.maximum(ops.subtract(lengths, i64(1)), i64(0))  # [S]
    cells = ops.add(
        ops.unsqueeze(starts, i64([1])), ops.minimum(ops.unsqueeze(step, i64([0])), ops.unsqueeze(last, i64([1])))
    )
    total = ops.gather(ops.shape_of(rows_like, ov.Type.i64), i64(0), i64(0))  # []
    row = ops.range(i64(0), total, i64(1), ov.Type.i64)  # [T]
    after = ops.less_equal(ops.unsqueeze(ends, i64([0])), ops.unsqueeze(row, i64([1])))  # [T, S]: sequences ended
    sequence = ops.reduce_sum(ops.convert(after, ov.Type.i64), i64([1]), False)  # [T]
    row_step = ops.subtract(row, ops.gather(starts, sequence, i64(0)))  # [T]
    row_cells = ops.concat([ops.unsqueeze(sequence, i64([1])), ops.unsqueeze(row_step, i64([1]))], 1)  # [T, 2]
    return StepGrid(
        named(cells, "linear_attention/grid/cells"),
        named(lengths, "linear_attention/grid/lengths"),
        named(steps, "linear_attention/grid/steps"),
        named(row_cells, "linear_attention/grid/row_cells"),
        named(ops.gather(sequence, state_rows, i64(0)), "linear_attention/grid/state_sequence"),
        named(ops.gather(row_step, state_rows, i64(0)), "linear_attention/grid/state_step"),
    )

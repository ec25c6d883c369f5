"""Packed-row helpers: many sequences share one token axis, delimited by prefix sums (`subsequence_begins`-style)."""

from __future__ import annotations

import numpy as np
import openvino as ov
import openvino.opset16 as ops

from ovbuild.graph.ops import Output, i32, i64, named


def row_numbers(x: Output, path: str) -> Output:
    """0 .. N-1 for the N rows (first axis) of x: [N] i32."""
    n = ops.gather(ops.shape_of(x, ov.Type.i32), i32(0), i64(0))  # []
    return named(ops.range(i32(0), n, i32(1), ov.Type.i32), path)


def row_sequences(begins: Output, rows: Output, path: str) -> Output:
    """Sequence of each row: begins [S+1] i32 (prefix sums), rows [N] i32 row numbers -> [N] i32.

    Row r belongs to the number of sequences that end at or before it, which also steps over empty sequences.
    """
    ends = ops.slice(begins, i32([1]), i32([np.iinfo(np.int32).max]), i32([1]))  # [S]
    ended = ops.less_equal(ops.unsqueeze(ends, i64(0)), ops.unsqueeze(rows, i64(1)))  # [N, S]
    return named(ops.reduce_sum(ops.convert(ended, ov.Type.i32), i64(1)), path)  # [N]


def shift_rows(x: Output, offset: int, path: str) -> Output:
    """Row t of the result is row t - offset of x, zero for t < offset: x [N, ...] -> [N, ...]."""
    rank = x.get_partial_shape().rank.get_length()
    padded = ops.pad(x, i64([offset] + [0] * (rank - 1)), i64([0] * rank), "constant")  # [N + offset, ...]
    return named(ops.slice(padded, i64([0]), i64([-offset]), i64([1]), i64([0])), path)  # [N, ...]


def window_band(begins: Output, window: int, path: str) -> tuple[Output, Output]:
    """PagedAttention's query-to-query mask (qq_bias) keeping |i - j| < window between the new rows of each sequence.

    begins [S+1] i32 (`subsequence_begins`) -> bias [sum n_s^2] u8, each sequence's n_s x n_s mask row-major one after
    the other, and bias_begins [S+1] i32, its prefix sums. A sequence's new rows hold consecutive positions, so row
    distance is position distance. Per-row tables are computed on the T rows; each of the L mask elements then finds
    its row in one pass (a 1 at every row start, summed up) and compares its own flat index with its row's diagonal
    one. No [rows, rows] intermediate; SearchSorted instead would take ~90 us per element on the CPU.

        rows ─ sequence ─ local row r, n_s ─ row start = bias_begins[s] + r * n_s ─ diagonal = row start + r
        marks at row starts ─ cumsum ─ row of element ─ |diagonal[row] - element| < window
    """
    total_rows = ops.gather(begins, i32([-1]), i64(0))  # [1]
    rows = ops.range(i32(0), ops.squeeze(total_rows, i64(0)), i32(1), ov.Type.i32)  # [T]
    sequence = row_sequences(begins, rows, f"{path}/row_sequence")  # [T]
    counts = ops.subtract(
        ops.slice(begins, i32([1]), i32([np.iinfo(np.int32).max]), i32([1])),
        ops.slice(begins, i32([0]), i32([-1]), i32([1])),
    )  # [S]
    squares = ops.multiply(counts, counts)  # [S]
    bias_begins = named(ops.concat([i32([0]), ops.cumsum(squares, i32(0))], 0), f"{path}/begins")  # [S+1]
    local = ops.subtract(rows, ops.gather(begins, sequence, i64(0)))  # [T]: row within its sequence
    n = ops.gather(counts, sequence, i64(0))  # [T]
    row_start = ops.add(ops.gather(bias_begins, sequence, i64(0)), ops.multiply(local, n))  # [T]
    # [T + 1]: element index of each row's diagonal, after a 0 so that a count of row starts indexes it directly
    diagonal = ops.concat([i32([0]), ops.add(row_start, local)], 0)
    total = ops.reduce_sum(squares, i32(0), True)  # [1]: L
    marks = ops.scatter_elements_update(
        ops.broadcast(i32(0), total), row_start, ops.broadcast(i32(1), ops.shape_of(row_start)), i64(0)
    )  # [L]: 1 where a row starts (every row has n_s >= 1 elements, so starts are distinct and < L)
    row_of = ops.cumsum(marks, i32(0))  # [L]: row + 1
    element = ops.range(i32(0), ops.squeeze(total, i64(0)), i32(1), ov.Type.i32)  # [L]
    distance = ops.subtract(ops.gather(diagonal, row_of, i64(0)), element)  # [L]: row - column
    inside = ops.less(ops.abs(distance), i32(window))  # [L]
    return named(ops.convert(inside, ov.Type.u8), path), bias_begins

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
    distance is position distance. Every element finds its sequence by a sorted search: no [rows, rows] intermediate.

        begins ─ counts n_s ─ n_s^2 ─ cumsum ─ bias_begins
        range(sum n_s^2) ─ sequence ─ local index ─ (row, column) = divmod(local, n_s) ─ |row - column| < window
    """
    counts = ops.subtract(
        ops.slice(begins, i32([1]), i32([np.iinfo(np.int32).max]), i32([1])),
        ops.slice(begins, i32([0]), i32([-1]), i32([1])),
    )  # [S]
    squares = ops.multiply(counts, counts)  # [S]
    ends = ops.cumsum(squares, i32(0))  # [S]: where each sequence's mask ends
    bias_begins = named(ops.concat([i32([0]), ends], 0), f"{path}/begins")  # [S+1]
    total = ops.reduce_sum(squares, i32(0), False)  # []
    flat = ops.range(i32(0), total, i32(1), ov.Type.i32)  # [L]
    sequence = ops.search_sorted(ends, flat, right_mode=True)  # [L] i64: masks ending at or before the element
    local = ops.subtract(flat, ops.gather(bias_begins, sequence, i64(0)))  # [L]
    n = ops.gather(counts, sequence, i64(0))  # [L]
    row = ops.divide(local, n)  # [L]: integer division of non-negative values
    column = ops.subtract(local, ops.multiply(row, n))  # [L]
    inside = ops.less(ops.abs(ops.subtract(row, column)), i32(window))  # [L]
    return named(ops.convert(inside, ov.Type.u8), path), bias_begins

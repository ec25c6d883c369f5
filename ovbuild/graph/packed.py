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

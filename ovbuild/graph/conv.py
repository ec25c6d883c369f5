"""Grouped dynamic convolution (DFlash v2) on packed rows.

For a block of rows, with z viewed as [rows, G, group_size]:
    out[t, g, c] = sum over taps o < k of (base[o, g * group_size + c] + dyn[t, o, g]) * z[t - o, g, c]
where z[t - o] counts only when row t - o lies in the same block as row t. On the packed token axis, tap o shifts
the rows down by o and multiplies by a per-row mask [index of the row in its block >= o], so a tap never reaches a
context row or another sequence's rows:

    z ─┬───────────────────────────────── * (base[0] + dyn[:, 0]) ─┐
       ├─ shift 1 ─ * mask(index >= 1) ── * (base[1] + dyn[:, 1]) ─┼─ sum ─ out
       └─ shift 2 ─ * mask(index >= 2) ── * (base[2] + dyn[:, 2]) ─┘
"""

from __future__ import annotations

import numpy as np
import openvino as ov
import openvino.opset16 as ops

from ovbuild.graph.context import BuildContext, path
from ovbuild.graph.ops import Output, i32, i64, named
from ovbuild.graph.packed import row_numbers, row_sequences, shift_rows


def block_row_index(token_type_ids: Output, subsequence_begins: Output) -> Output:
    """Index of each packed row inside its sequence's block, -1 on context rows: [T] i32 -> [T] i32.

    Per-row layout: each sequence's chunk is its context rows (token_type_ids 0) then its block rows (1), so the
    index is the count of block rows of the same sequence up to and including the row, minus one.
    """
    is_block = ops.convert(ops.equal(token_type_ids, i32(1)), ov.Type.i32)  # [T]
    seen = ops.cumsum(is_block, i64(0))  # [T]: block rows up to and including each row
    rows = row_numbers(token_type_ids, "conv/rows")
    first_row = ops.gather(subsequence_begins, row_sequences(subsequence_begins, rows, "conv/row_sequence"), i64(0))
    before = ops.gather(ops.subtract(seen, is_block), first_row, i64(0))  # [T]: block rows before the sequence
    return named(ops.subtract(ops.subtract(seen, before), i32(1)), "conv/block_row_index")


def tap_masks(index: Output, kernel_size: int) -> list[Output]:
    """masks[o - 1] [T, 1] f32 keeps tap o (o >= 1) on rows at least o deep into their block; tap 0 needs none."""
    index = ops.unsqueeze(index, i64(1))  # [T, 1]
    return [
        named(ops.convert(ops.greater_equal(index, i32(o)), ov.Type.f32), f"conv/tap{o}_mask")
        for o in range(1, kernel_size)
    ]


def grouped_dynamic_conv(
    z: Output, dyn: Output, base: np.ndarray, masks: list[Output], group_size: int, p: str
) -> Output:
    """z [T, H], dyn [T, k, G] (coefficients of each output row), base [k, H] -> [T, H], nodes named under `p`."""
    k, hidden = base.shape
    groups = hidden // group_size
    taps = ops.split(dyn, i64(1), k).outputs()  # k x [T, 1, G]
    terms = []
    for o in range(k):
        shifted = z if o == 0 else ops.multiply(shift_rows(z, o, f"{p}/tap{o}/shift"), masks[o - 1])  # [T, H]
        grouped = ops.reshape(shifted, i64([0, groups, group_size]), True)  # [T, G, group_size]
        per_row = ops.reshape(taps[o], i64([0, groups, 1]), True)  # [T, G, 1]
        base_o = named(ops.constant(np.ascontiguousarray(base[o].reshape(groups, group_size))), f"{p}/tap{o}/base")
        coefficient = ops.add(base_o, per_row)  # [T, G, group_size]
        terms.append(named(ops.multiply(grouped, coefficient), f"{p}/tap{o}"))
    total = terms[0]
    for term in terms[1:]:
        total = ops.add(total, term)
    return named(ops.reshape(total, i64([0, hidden]), True), p)  # [T, H]


class GroupedDynamicConv:
    """One `layers.i.<name>` module: coefficients of both stages projected from the normalized sublayer input u.

    prepare(u) convolves the sublayer input with stage 0; finish(y) convolves the sublayer output with stage 1.
    """

    def __init__(self, ctx: BuildContext, name: str, u: Output, masks: list[Output], kernel_size: int, group_size: int):
        h = ctx.cfg.hidden_size
        groups = h // group_size
        self.name, self.masks, self.group_size = name, masks, group_size
        self.base = ctx.weights.get(f"{name}.base_kernel", (2, kernel_size, h)).to_f32()  # [2, k, H]
        projected = ctx.linear(u, f"{name}.kernel_projection", 2 * kernel_size * groups, h)  # [T, 2 * k * G]
        stages = ops.reshape(projected, i64([0, 2, kernel_size, groups]), True)  # [T, 2, k, G]
        self.dyn = [
            ops.reshape(s, i64([0, kernel_size, groups]), True).output(0)  # [T, k, G]
            for s in ops.split(stages, i64(1), 2).outputs()  # 2 x [T, 1, k, G]
        ]

    def prepare(self, u: Output) -> Output:
        """Stage 0 on the sublayer input u [T, H] -> [T, H]."""
        return self._stage(0, u, "prepare")

    def finish(self, y: Output) -> Output:
        """Stage 1 on the sublayer output y [T, H] -> [T, H]."""
        return self._stage(1, y, "finish")

    def _stage(self, stage: int, z: Output, name: str) -> Output:
        p = f"{path(self.name)}/{name}"
        return grouped_dynamic_conv(z, self.dyn[stage], self.base[stage], self.masks, self.group_size, p)

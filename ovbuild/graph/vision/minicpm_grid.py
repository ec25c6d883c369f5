"""Where each packed patch of a MiniCPM-V call sits, computed in the graph from `target_sizes` alone: its image, its
row and column there, and from those the position-table index, the order that groups k x k neighbours together
(the window merger's windows and the merger's groups) and which patches may attend to which.

Images are packed one after the other, each row-major: image i (h_i x w_i patches) holds packed rows
[start_i, start_i + h_i * w_i), start_i = sum of the earlier h * w.
"""

from __future__ import annotations

from dataclasses import dataclass

import openvino as ov
import openvino.opset16 as ops

from ovbuild.graph.ops import Output, i64, named


@dataclass(frozen=True)
class PatchGrid:
    """Per packed patch (all [L] i64): its image, its index inside it, the image's first packed row, the image's
    height and width, and its own row and column."""

    image: Output
    local: Output
    start: Output
    height: Output
    width: Output
    row: Output
    col: Output
    sizes: Output  # [N, 2] the grids it was computed from


def patch_grid(sizes: Output, count: Output, path: str) -> PatchGrid:
    """The grid of `count` ([] i64, = sum h * w) packed patches of images `sizes` [N, 2] i64."""
    heights = ops.gather(sizes, i64(0), i64(1))  # [N]
    widths = ops.gather(sizes, i64(1), i64(1))  # [N]
    ends = ops.cumsum(ops.multiply(heights, widths), i64(0))  # [N]: one past each image's last row
    rows = ops.range(i64(0), count, i64(1), ov.Type.i64)  # [L]
    # a patch belongs to the number of images that end at or before it
    ended = ops.less_equal(ops.unsqueeze(ends, i64(0)), ops.unsqueeze(rows, i64(1)))  # [L, N]
    image = named(ops.reduce_sum(ops.convert(ended, ov.Type.i64), i64(1)), f"{path}/image")  # [L]
    height = ops.gather(heights, image, i64(0))  # [L]
    width = ops.gather(widths, image, i64(0))  # [L]
    start = ops.subtract(ops.gather(ends, image, i64(0)), ops.multiply(height, width))  # [L]
    local = ops.subtract(rows, start)  # [L]
    row = ops.divide(local, width)  # non-negative, so integer division floors
    col = ops.subtract(local, ops.multiply(row, width))
    return PatchGrid(
        image, local, start.output(0), height.output(0), width.output(0), row.output(0), col.output(0), sizes
    )


def nearest_positions(grid: PatchGrid, side: int, path: str) -> Output:
    """Each patch's row of the side x side position table: bucket(row / h) * side + bucket(col / w), bucket(x) the
    number of k / side (k = 1 .. side - 1) at or below x, i.e. floor(row * side / h) in exact integers ([L] i64)."""
    s = i64(side)
    bucket_h = ops.divide(ops.multiply(grid.row, s), grid.height)  # [L]
    bucket_w = ops.divide(ops.multiply(grid.col, s), grid.width)  # [L]
    return named(ops.add(ops.multiply(bucket_h, s), bucket_w), path)


def grouped_order(grid: PatchGrid, kh: int, kw: int, path: str) -> Output:
    """The packed row that goes to each position when every image's patches are regrouped kh x kw: groups
    row-major over the (h / kh) x (w / kw) grid, the kh * kw patches row-major inside each ([L] i64).

    Position j of image i (index r inside it) is patch t = r % (kh*kw) of group g = r // (kh*kw), at row
    (g // (w/kw)) * kh + t // kw and column (g % (w/kw)) * kw + t % kw of the image.
    """
    group_size = i64(kh * kw)
    group = ops.divide(grid.local, group_size)  # [L]
    inside = ops.subtract(grid.local, ops.multiply(group, group_size))  # [L]
    groups_per_row = ops.divide(grid.width, i64(kw))  # [L]
    group_row = ops.divide(group, groups_per_row)
    group_col = ops.subtract(group, ops.multiply(group_row, groups_per_row))
    inner_row = ops.divide(inside, i64(kw))
    inner_col = ops.subtract(inside, ops.multiply(inner_row, i64(kw)))
    src_row = ops.add(ops.multiply(group_row, i64(kh)), inner_row)
    src_col = ops.add(ops.multiply(group_col, i64(kw)), inner_col)
    return named(ops.add(grid.start, ops.add(ops.multiply(src_row, grid.width), src_col)), path)


def same_image(grid: PatchGrid, path: str) -> Output:
    """Which patch may attend to which: the block-diagonal [L, L] boolean of equal image indices."""
    return named(ops.equal(ops.unsqueeze(grid.image, i64(1)), ops.unsqueeze(grid.image, i64(0))), path)


def downsampled(sizes: Output, kh: int, kw: int, path: str) -> Output:
    """The grids after regrouping kh x kw: [N, 2] i64."""
    return named(ops.divide(sizes, i64([kh, kw])), path)


def token_counts(sizes: Output, path: str) -> Output:
    """h * w of each grid: [N] i64."""
    return named(ops.reduce_prod(sizes, i64(1)), path)

"""MiniCPM-V's slice geometry (MiniCPMV4_6ImageProcessorPil, which MiniCPM-V 4.7 uses): the grid of slices that best
matches the image's shape, the size of the source image's overview and of the refined image cut into slices.
Sizes are (height, width); the arithmetic is transformers' own, float and round-half-to-even alike, because one pixel
of difference changes the patch grid."""

from __future__ import annotations

import math

# Two successive 2x2 spatial merges (the window-attention merger inside the tower, then the downsampling MLP): every
# side is a multiple of 4 patches.
MERGE_FACTOR = 4


def ensure_divide(length: float, divisor: int) -> int:
    """`length` rounded to a multiple of `divisor`, at least `divisor`."""
    return max(round(length / divisor) * divisor, divisor)


def find_best_resize(
    size: tuple[float, float], scale_resolution: int, patch_size: int, allow_upscale: bool = False
) -> tuple[int, int]:
    """The overview size: scaled to about scale_resolution^2 pixels when larger (or when upscaling is allowed), each
    side then a multiple of patch_size * 4."""
    height, width = size
    if (height * width > scale_resolution * scale_resolution) or allow_upscale:
        aspect_ratio = width / height
        height = int(scale_resolution / math.sqrt(aspect_ratio))
        width = int(height * aspect_ratio)
    return ensure_divide(height, patch_size * MERGE_FACTOR), ensure_divide(width, patch_size * MERGE_FACTOR)


def refine_size(
    size: tuple[int, int], grid: tuple[int, int], scale_resolution: int, patch_size: int
) -> tuple[int, int]:
    """The size the image is resized to before it is cut into grid = (rows, cols) equal slices."""
    height, width = size
    rows, cols = grid
    refine_width = ensure_divide(width, cols)
    refine_height = ensure_divide(height, rows)
    best_height, best_width = find_best_resize(
        (refine_height / rows, refine_width / cols), scale_resolution, patch_size, allow_upscale=True
    )
    return best_height * rows, best_width * cols


def slice_grid(size: tuple[int, int], max_slice_nums: int, scale_resolution: int) -> tuple[int, int] | None:
    """(rows, cols) of slices for an image of `size`, or None when the overview alone covers it: the slice count is
    about the image's area in scale_resolution^2 units (at most max_slice_nums), and among the counts one below, at and
    one above it the factorisation whose cols/rows is nearest the image's aspect ratio in log space wins (more rows on
    a tie)."""
    height, width = size
    log_ratio = math.log(width / height)
    ratio = width * height / (scale_resolution * scale_resolution)
    multiple = min(math.ceil(ratio), max_slice_nums)
    if multiple <= 1:
        return None
    best = (1, 1)
    min_error = float("inf")
    for num_slices in (multiple - 1, multiple, multiple + 1):
        if num_slices == 1 or num_slices > max_slice_nums:
            continue
        for rows in range(1, num_slices + 1):
            if num_slices % rows == 0:
                cols = num_slices // rows
                error = abs(log_ratio - math.log(cols / rows))
                if error < min_error or (error == min_error and rows > best[0]):
                    best, min_error = (rows, cols), error
    return best

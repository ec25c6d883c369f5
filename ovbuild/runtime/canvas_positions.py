"""MiniCPM-V 4.7's three-axis positions ("canvas" M-RoPE), as transformers' MiniCPMV4_7Model.get_rope_index lays
them out, in numpy: each picture is a canvas, its thumbnail stretched over the slices that tile it, the markers around
each crop pinned to the canvas' corners and edges. Unlike Qwen3.5's (runtime/images.py, prompt_positions) the layout
reads the token ids around each crop. Formulas: docs/vision.md, "Image positions and the runtime".
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class CanvasMarkers:
    """The marker token ids of a MiniCPM-V 4.7 prompt (config.json: slice_start_id, ... newline_id)."""

    slice_start: int
    slice_end: int
    image_start: int
    image_end: int
    newline: int

    def ids(self) -> tuple[int, ...]:
        return (self.slice_start, self.slice_end, self.image_start, self.image_end, self.newline)


# one frame: (modality, thumbnail start, thumbnail end, frame end, [(slice start, slice end), ...])
Frame = tuple[int, int, int, int, list[tuple[int, int]]]


def visual_groups(ids: list[int], types: list[int], markers: CanvasMarkers) -> list[tuple[int, int, list[Frame]]]:
    """The prompt's runs of frames that only markers separate: (group start, group end, frames), as
    _group_visual_frames. A crop (a maximal run of non-text tokens) right after <slice> is a slice of the open frame;
    any other crop opens a frame."""
    marks = markers.ids()
    groups: list[tuple[int, list]] = []
    open_slices: list | None = None
    previous_end = 0
    for modality, run in itertools.groupby(enumerate(types), lambda item: item[1]):
        if modality == 0:
            continue
        run = list(run)
        crop = (run[0][0], run[-1][0] + 1)
        if open_slices is not None and ids[crop[0] - 1] == markers.slice_start:
            open_slices.append(crop)
        else:
            open_slices = []
            frame = (modality, crop[0], crop[1], open_slices)
            adjacent = bool(groups) and all(t in marks for t in ids[previous_end : crop[0] - 1])
            if adjacent:
                groups[-1][1].append(frame)
            else:
                groups.append((crop[0] - 1, [frame]))
        previous_end = crop[1]
    out = []
    for start, frames in groups:
        closed = []
        for modality, thumb_start, thumb_end, slices in frames:
            end = slices[-1][1] if slices else thumb_end
            while end < len(ids) and ids[end] in marks:  # the markers that close the frame
                end += 1
            closed.append((modality, thumb_start, thumb_end, end, slices))
        out.append((start, closed[-1][3], closed))
    return out


def torch_linspace(end: int, steps: int) -> np.ndarray:
    """torch.linspace(0, end, steps) in float32 as ATen computes it (from both ends toward the middle)."""
    if steps == 1:
        return np.zeros(1, np.float32)
    step = np.float32(end) / np.float32(steps - 1)
    i = np.arange(steps)
    low = np.float32(0) + step * i.astype(np.float32)
    high = np.float32(end) - step * (steps - i - 1).astype(np.float32)
    return np.where(i < steps // 2, low, high).astype(np.float32)


def crop_positions(start: int, size: tuple[int, int], merge: int, canvas=(0, 0), offset=(0, 0)) -> np.ndarray:
    """Positions [3, h * w] of one crop of `size` patches (h, w) on a canvas (0: its own grid), its top-left corner
    at `offset` (in LLM tokens): temporal fixed at start, height and width linspace-rounded over the canvas."""
    h, w = size[0] // merge, size[1] // merge
    canvas_h, canvas_w = canvas[0] or h, canvas[1] or w
    rows = np.rint(torch_linspace(canvas_h - 1, h)).astype(np.int64) + offset[0]  # round half to even, as torch
    cols = np.rint(torch_linspace(canvas_w - 1, w)).astype(np.int64) + offset[1]
    hh, ww = np.meshgrid(rows, cols, indexing="ij")
    return np.stack([np.zeros_like(hh).ravel(), hh.ravel(), ww.ravel()]) + start


def canvas_positions(
    ids: list[int], types: list[int], sizes: list[tuple[int, int]], markers: CanvasMarkers, merge: int = 4
) -> tuple[np.ndarray, int]:
    """Positions [3, P] of a prompt (token ids; types: 0 text, 1 image, 2 video per token) whose crops have patch
    grids `sizes` (in order, as target_sizes), and its rope delta. merge: 4 in "16x" mode, 2 in "4x"."""
    n = len(ids)
    pos = np.tile(np.arange(n, dtype=np.int64), (3, 1))
    grids = iter(sizes)
    current, index = 0, 0
    for group_start, group_end, frames in visual_groups(ids, types, markers):
        if group_start > index:
            pos[:, index:group_start] = np.arange(group_start - index) + current
            current += group_start - index
        cursor = group_start
        for _, thumb_start, thumb_end, frame_end, slices in frames:
            thumb = next(grids)
            frame_start = thumb_start - 1
            if frame_start > cursor:  # text between two frames of a clip; one step more keeps the halo off it
                pos[:, cursor:frame_start] = np.arange(frame_start - cursor) + current
                current += frame_start - cursor + 1
            frame_end = min(frame_end, group_end)
            origin = current
            canvas_h, canvas_w = thumb[0] // merge, thumb[1] // merge
            slice_h = slice_w = cols = 0
            if slices:
                cols = len(slices)  # a gap wider than </slice><slice> is a row's newline
                for k in range(len(slices) - 1):
                    if slices[k + 1][0] - slices[k][1] > 2:
                        cols = k + 1
                        break
                rows = len(slices) // cols if cols > 0 else 1
                if rows * cols != len(slices):
                    rows, cols = 1, len(slices)
                first = next(grids)
                slice_h, slice_w = first[0] // merge, first[1] // merge
                canvas_h, canvas_w = rows * slice_h, cols * slice_w
            pos[:, frame_start:frame_end] = origin
            pos[1:, frame_start] = max(origin - 1, 0)  # <image>: the halo just outside the canvas
            if thumb_end < frame_end:  # </image>: the canvas' far corner
                pos[1, thumb_end], pos[2, thumb_end] = origin + canvas_h, origin + canvas_w
            pos[:, thumb_start:thumb_end] = crop_positions(origin, thumb, merge, (canvas_h, canvas_w))
            for k, (s_start, s_end) in enumerate(slices):
                h_off, w_off = (k // cols) * slice_h, (k % cols) * slice_w
                size = first if k == 0 else next(grids)
                sh, sw = size[0] // merge, size[1] // merge
                if s_start - 1 >= frame_start:  # <slice>: its top-left corner
                    pos[1, s_start - 1], pos[2, s_start - 1] = origin + h_off, origin + w_off
                if s_end < frame_end:  # </slice>: its bottom-right corner
                    pos[1, s_end], pos[2, s_end] = origin + h_off + sh - 1, origin + w_off + sw - 1
                pos[:, s_start:s_end] = crop_positions(origin, size, merge, offset=(h_off, w_off))
            for k in range(len(slices) - 1):  # a row's newline sits just past the row's right edge
                gap_start, gap_end = slices[k][1], slices[k + 1][0]
                if gap_end - gap_start <= 2:
                    continue
                for newline in range(gap_start + 1, gap_end - 1):
                    pos[1, newline] = origin + (k // cols + 1) * slice_h - 1
                    pos[2, newline] = origin + cols * slice_w
            current = origin + max(canvas_h, canvas_w) + 1
            cursor = frame_end
        if cursor < group_end:
            pos[:, cursor:group_end] = np.arange(group_end - cursor) + current
            current += group_end - cursor
        index = group_end
    if index < n:
        pos[:, index:] = np.arange(n - index) + current
    return pos, int(pos.max(initial=-1)) + 1 - n

"""The three-axis positions of a prompt showing images (transformers' Qwen3.5 get_rope_index, and MiniCPM-V 4.7's
canvas layout), against values worked out by hand from the formulas in docs/vision.md."""

from __future__ import annotations

import numpy as np
import pytest

from ovbuild.errors import RequestError
from ovbuild.runtime.canvas_positions import CanvasMarkers, canvas_positions, torch_linspace
from ovbuild.runtime.images import ImageInput, prompt_positions


def image(start: int, grid: tuple[int, int, int]) -> ImageInput:
    return ImageInput(start, np.zeros((int(np.prod(grid)), 4), np.float32), grid)


def test_text_only_prompt_counts_on_every_axis():
    positions, delta = prompt_positions(5, [])
    assert positions.tolist() == [[0, 1, 2, 3, 4]] * 3
    assert delta == 0


def test_one_image_between_text():
    # 2 text tokens, a 1 x 2 x 3 image at token 2 (positions counted from 2), then text from 2 + max(2, 3) = 5
    positions, delta = prompt_positions(10, [image(2, (1, 2, 3))])
    assert positions.tolist() == [
        [0, 1, 2, 2, 2, 2, 2, 2, 5, 6],
        [0, 1, 2, 2, 2, 3, 3, 3, 5, 6],
        [0, 1, 2, 3, 4, 2, 3, 4, 5, 6],
    ]
    assert delta == 7 - 10  # the next token (index 10) takes position 7


def test_two_images_and_a_frame_axis():
    # text 0; a 2 x 2 x 2 grid from 1 (t, h, w each 1 + index); text resumes at 1 + 2 = 3, 4; a 1 x 1 x 2 grid at
    # 5 (a second image), text resumes at 5 + 2 = 7
    images = [image(1, (2, 2, 2)), image(11, (1, 1, 2))]
    positions, delta = prompt_positions(14, images)
    assert positions.tolist() == [
        [0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 4, 5, 5, 7],
        [0, 1, 1, 2, 2, 1, 1, 2, 2, 3, 4, 5, 5, 7],
        [0, 1, 2, 1, 2, 1, 2, 1, 2, 3, 4, 5, 6, 7],
    ]
    assert delta == 8 - 14


def test_more_frames_than_rows_step_by_the_spatial_side_only():
    # transformers steps the text past max(h, w), not past the last frame: a 3 x 1 x 1 grid at 0 reaches temporal
    # position 2, the text after it restarts at 1, and the delta follows the largest position (2): 2 + 1 - 4
    positions, delta = prompt_positions(4, [image(0, (3, 1, 1))])
    assert positions.tolist() == [[0, 1, 2, 1], [0, 0, 0, 1], [0, 0, 0, 1]]
    assert delta == -1


def test_bad_spans_are_refused():
    with pytest.raises(RequestError, match="overlaps"):
        prompt_positions(20, [image(0, (1, 2, 2)), image(3, (1, 1, 1))])
    with pytest.raises(RequestError, match="leaves the prompt"):
        prompt_positions(5, [image(2, (1, 2, 2))])
    with pytest.raises(RequestError, match="do not fill its grid"):
        ImageInput(0, np.zeros((5, 4), np.float32), (1, 2, 2))


def test_the_content_hash_defaults_to_the_embeddings():
    a, b = image(0, (1, 1, 2)), image(3, (1, 1, 2))
    c = ImageInput(0, np.ones((2, 4), np.float32), (1, 1, 2))
    assert a.content_hash == b.content_hash != c.content_hash
    assert ImageInput(0, np.ones((2, 4), np.float32), (1, 1, 2), "pixels:1").content_hash == "pixels:1"


# MiniCPM-V 4.7's canvas layout, markers as below; 20 stands for an image token; merge 4 ("16x": 4 x 4 patches a token)
MARKERS = CanvasMarkers(slice_start=10, slice_end=11, image_start=12, image_end=13, newline=14)


def types_of(ids: list[int]) -> list[int]:
    return [1 if t == 20 else 0 for t in ids]


def test_canvas_of_a_thumbnail_alone():
    # text 0, 1; <image> at 2 (halo: height and width one before the origin 2); a 2 x 2 thumbnail from the origin;
    # </image> on the far corner (2 + 2, 2 + 2); text resumes at origin + max(2, 2) + 1 = 5
    ids = [1, 2, 12, 20, 20, 20, 20, 13, 3, 4]
    positions, delta = canvas_positions(ids, types_of(ids), [(8, 8)], MARKERS)
    assert positions.tolist() == [
        [0, 1, 2, 2, 2, 2, 2, 2, 5, 6],
        [0, 1, 1, 2, 2, 3, 3, 4, 5, 6],
        [0, 1, 1, 2, 3, 2, 3, 4, 5, 6],
    ]
    assert delta == 7 - 10


def test_canvas_of_a_thumbnail_over_two_slices():
    # a 2 x 3 thumbnail stretched over a 2 x 4 canvas (two 2 x 2 slices side by side): its columns are
    # round(linspace(0, 3, 3)) = round([0, 1.5, 3]) = [0, 2, 3] (half to even); each <slice> pins its top-left corner,
    # each </slice> its bottom-right one; text resumes at 1 + max(2, 4) + 1 = 6
    thumb, piece = [20] * 6, [20] * 4
    ids = [1, 12, *thumb, 13, 10, *piece, 11, 10, *piece, 11, 5]
    positions, delta = canvas_positions(ids, types_of(ids), [(8, 12), (8, 8), (8, 8)], MARKERS)
    assert positions.tolist() == [
        [0] + [1] * 20 + [6],
        [0, 0, 1, 1, 1, 2, 2, 2, 3, 1, 1, 1, 2, 2, 2, 1, 1, 1, 2, 2, 2, 6],
        [0, 0, 1, 3, 4, 1, 3, 4, 5, 1, 1, 2, 1, 2, 2, 3, 3, 4, 3, 4, 4, 6],
    ]
    assert delta == 7 - 22


def test_torch_linspace_rounds_from_both_ends():
    assert torch_linspace(3, 3).tolist() == [0.0, 1.5, 3.0]
    assert torch_linspace(5, 1).tolist() == [0.0]
    assert np.rint(torch_linspace(1, 3)).tolist() == [0.0, 0.0, 1.0]  # 0.5 rounds to even


def test_canvas_of_slices_in_two_rows():
    # two 2 x 2 slices one above the other (a newline between them): a 4 x 2 canvas; the 2 x 2 thumbnail's rows are
    # round(linspace(0, 3, 2)) = [0, 3]; the second slice sits 2 rows down; the newline just past the first row's right
    # edge (height 1 + 2 - 1, width 1 + 2); text resumes at 1 + max(4, 2) + 1 = 6
    piece = [20] * 4
    ids = [1, 12, *piece, 13, 10, *piece, 11, 14, 10, *piece, 11, 5]
    positions, delta = canvas_positions(ids, types_of(ids), [(8, 8), (8, 8), (8, 8)], MARKERS)
    assert positions.tolist() == [
        [0] + [1] * 19 + [6],
        [0, 0, 1, 1, 4, 4, 5, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 4, 4, 4, 6],
        [0, 0, 1, 2, 1, 2, 3, 1, 1, 2, 1, 2, 2, 3, 1, 1, 2, 1, 2, 2, 6],
    ]
    assert delta == 7 - 21

"""The three-axis positions of a prompt showing images (transformers' Qwen3.5 get_rope_index), against values
worked out by hand from the formula in docs/vision.md."""

from __future__ import annotations

import numpy as np
import pytest

from ovbuild.errors import RequestError
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

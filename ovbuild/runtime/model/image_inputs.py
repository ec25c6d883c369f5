"""The image inputs of a target that takes images, as a call feeds them when it shows no image."""

from __future__ import annotations

import numpy as np

from ovbuild.ir.ports import IMAGE_ROWS, MROPE_OFFSETS, PLACED_EMBEDS


def image_width(inputs: list) -> int | None:
    """The embedding width of a compiled model's image_embeds input (ov outputs), None for a model without one."""
    port = next((p for p in inputs if p.get_any_name() == PLACED_EMBEDS), None)
    return None if port is None else port.get_partial_shape()[1].get_length()


def text_call(rows: int, width: int) -> dict[str, np.ndarray]:
    """The image inputs of a call that shows no image: every axis at position_ids, no image rows."""
    return {
        MROPE_OFFSETS: np.zeros((rows, 3), np.int64),
        IMAGE_ROWS: np.zeros(0, np.int64),
        PLACED_EMBEDS: np.zeros((0, width), np.float32),
    }

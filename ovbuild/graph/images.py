"""What a vision-language target's language model adds for image prompts: three-axis positions and image
embeddings written over the embedded rows they replace (the vision tower that makes them is another IR).

    input_ids ─ embed_tokens ─ ScatterNDUpdate(rows = image_rows, values = image_embeds) ─ layers
    position_ids + mrope_offsets ─ per-frequency axis ─ cos / sin (graph/rope.py, mrope_tables)

With no image rows the scatter writes nothing and with zero offsets the positions are position_ids: the text path.
"""

from __future__ import annotations

from dataclasses import dataclass

import openvino as ov
import openvino.opset16 as ops

from ovbuild.graph.ops import Output, i64, named, parameter
from ovbuild.ir.ports import IMAGE_ROWS, MROPE_OFFSETS, PLACED_EMBEDS


@dataclass(frozen=True)
class ImageInputs:
    """The inputs of image prompts: mrope_offsets [T, 3] i64, image_embeds [I, H] f32, image_rows [I] i64."""

    offsets: ov.Node
    embeds: ov.Node
    rows: ov.Node

    @property
    def parameters(self) -> list[ov.Node]:
        return [self.offsets, self.embeds, self.rows]


def image_inputs(hidden_size: int) -> ImageInputs:
    """The three parameters, declared by their ports."""
    return ImageInputs(
        parameter(MROPE_OFFSETS, [-1, 3]), parameter(PLACED_EMBEDS, [-1, hidden_size]), parameter(IMAGE_ROWS, [-1])
    )


def place_images(x: Output, images: ImageInputs) -> Output:
    """x [T, H] with row image_rows[i] replaced by image_embeds[i]: [T, H]."""
    rows = ops.unsqueeze(images.rows.output(0), i64([1]))  # [I, 1]: one index tuple per embedding
    return named(ops.scatter_nd_update(x, rows, images.embeds.output(0)), "images/place")

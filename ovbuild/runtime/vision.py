"""A target folder's vision tower, compiled: pixel values and grids in, each image's embeddings out.

The runtime still never parses an image: an image processor (ovbuild/processor) makes the pixel values and grids,
and the embeddings this returns become ImageInputs (ovbuild.runtime.images). The tower's ports and formulas:
docs/vision.md, "Vision towers".
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ovbuild.errors import UnsupportedError
from ovbuild.ir import VISION_FILE, VisionIR, core, read_ir
from ovbuild.ir.ports import GRID_THW, IMAGE_EMBEDS, PIXEL_VALUES


class VisionTower:
    """openvino_vision_model.xml of a target folder, compiled with f32 math (the tower stays in float)."""

    def __init__(self, path: Path, device: str = "CPU"):
        model = read_ir(path)
        self.record = VisionIR.from_model(model, path)
        names = {p.get_any_name() for p in model.inputs}
        if GRID_THW not in names:
            raise UnsupportedError(
                f"{path}: image prompts through a {self.record.family} tower are not wired yet (the Qwen3.5-family "
                "tower is); pass its embeddings as ImageInputs"
            )
        self.merge = self.record.spatial_merge_size
        self.compiled = core().compile_model(model, device, {"INFERENCE_PRECISION_HINT": "f32"})

    @classmethod
    def in_folder(cls, folder: str | Path, device: str = "CPU") -> VisionTower:
        """The folder's tower; an error naming the folder when it was exported without one."""
        path = Path(folder) / VISION_FILE
        if not path.exists():
            raise UnsupportedError(f"{folder}: no vision tower ({VISION_FILE}): a text model, or exported --no-vision")
        return cls(path, device)

    def encode(self, pixel_values: list[np.ndarray], grids: list[np.ndarray]) -> list[np.ndarray]:
        """Each image's embeddings [t h w / merge², hidden] from its pixel values [patches, C T P P] and grid [1, 3]
        (t, h, w in patches), every image in one call."""
        grid = np.concatenate(grids).astype(np.int64)  # [images, 3]
        out = self.compiled({PIXEL_VALUES: np.concatenate(pixel_values), GRID_THW: grid})[IMAGE_EMBEDS]
        counts = grid.prod(1) // self.merge**2
        return np.split(np.asarray(out, np.float32), np.cumsum(counts)[:-1])

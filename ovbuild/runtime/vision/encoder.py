"""The vision encoder: a folder's vision tower IR, compiled once, turning one image at a time into the rows the
language model takes at its placeholders, with a small cache of recent images keyed by their content hash."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ovbuild.errors import ConfigError, ExportError, RequestError
from ovbuild.ir import VISION_FILE, VisionIR, core, last_line, read_ir
from ovbuild.ir.ports import IMAGE_EMBEDS
from ovbuild.runtime.model.devices import check_device

DEFAULT_CACHE_SIZE = 8  # images kept encoded: a request's few images, and the same ones in its next turn
F32_INFERENCE = {"INFERENCE_PRECISION_HINT": "f32"}  # parity with the reference matters more than speed here

# One image's inputs as the image processor gives them: (pixel_values, grid).
ImageInputs = tuple[np.ndarray, np.ndarray]


class VisionEncoder:
    """The vision tower of an exported folder (`openvino_vision_model.xml`), compiled once on `device` in f32.

    `encode` runs ONE image per IR call, so a prefill with eight images never holds more than one image's
    activations at once (the tower's attention mask alone grows with the square of a call's patches). Each image's
    inputs are the processor's (`ProcessedImage.pixel_values` and `.grid`), as plain arrays:

    - Qwen3.5 family: pixel_values [patches, C*T*P*P] f32, grid [1, 3] (t, h, w) in patches;
    - MiniCPM-V 4.7: pixel_values [1, C, P, patches*P] f32, grid [crops, 2] (h, w) in patches per crop (an image's
      overview and slices, encoded together: its crops are one image).

    They are checked against the IR's record first (a RequestError naming the input). An image given with a content
    hash is looked up in an LRU cache of `cache_size` images (0: none) before it is encoded. Several threads may
    encode at once (a server's request handlers): the cache and the IR's one infer request are taken in turn.
    """

    def __init__(self, folder: str | Path, device: str = "CPU", cache_size: int = DEFAULT_CACHE_SIZE):
        path = Path(folder) / VISION_FILE
        if not path.is_file():
            raise ConfigError(f"{folder}: no vision tower ({VISION_FILE}); export the target without --no-vision")
        if cache_size < 0:
            raise ConfigError(f"vision cache_size {cache_size} is negative")
        model = read_ir(path)
        record = VisionIR.from_model(model, path)
        if record is None:
            raise ExportError(f"{path}: not a vision tower IR (its rt_info 'ovbuild/kind' is not 'vision')")
        check_device(device)
        try:
            self.compiled = core().compile_model(model, device, F32_INFERENCE)
        except RuntimeError as e:
            raise ExportError(f"{path}: does not compile on {device} ({last_line(e)})") from None
        self.record, self.device, self.cache_size = record, device, cache_size
        self.request = self.compiled.create_infer_request()
        self.cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self.lock = threading.Lock()  # one IR call at a time: the infer request and the cache are shared

    @property
    def hidden_size(self) -> int:
        """The width of every returned row: the language model's hidden size."""
        return self.record.out_hidden_size

    def encode(
        self, images: Sequence[ImageInputs], content_hashes: Sequence[str | None] | None = None
    ) -> list[np.ndarray]:
        """Each image's embeddings [tokens, hidden_size] f32 (read-only: a cached image's array is shared), in order;
        `content_hashes[i]` (None: not cached) keys image i in the cache. Every image is checked before any runs."""
        hashes = list(content_hashes) if content_hashes is not None else [None] * len(images)
        if len(hashes) != len(images):
            raise RequestError(f"{len(hashes)} content hashes for {len(images)} images", "content_hashes")
        checked = [self.checked(pixels, grid) for pixels, grid in images]
        return [self.encode_one(pixels, grid, key) for (pixels, grid), key in zip(checked, hashes, strict=True)]

    def checked(self, pixel_values: np.ndarray, grid: np.ndarray) -> ImageInputs:
        """One image's inputs as the IR takes them (f32 pixels, i64 grid), after the record's checks."""
        pixels = np.ascontiguousarray(pixel_values, dtype=np.float32)
        grid = np.ascontiguousarray(grid, dtype=np.int64)
        if grid.ndim != 2:
            name = self.record.inputs[1]
            raise RequestError(f"{name}: shape {list(grid.shape)} is not [rows, sides] (one row per grid)", name)
        self.record.check_inputs(pixels.shape, grid.tolist())
        return pixels, grid

    def encode_one(self, pixel_values: np.ndarray, grid: np.ndarray, content_hash: str | None = None) -> np.ndarray:
        """One image's embeddings, from the cache when `content_hash` is there (the IR is not called)."""
        pixels, grid = self.checked(pixel_values, grid)
        with self.lock:
            if content_hash is not None and content_hash in self.cache:
                self.cache.move_to_end(content_hash)
                return self.cache[content_hash]
            embeds = self.infer(pixels, grid)
            embeds.setflags(write=False)
            if content_hash is not None and self.cache_size > 0:
                self.cache[content_hash] = embeds
                while len(self.cache) > self.cache_size:
                    self.cache.popitem(last=False)
        return embeds

    def infer(self, pixels: np.ndarray, grid: np.ndarray) -> np.ndarray:
        """One IR call on checked inputs: the image's rows, copied out of the request's output buffer."""
        pixel_port, grid_port = self.record.inputs
        outputs = self.request.infer({pixel_port: pixels, grid_port: grid})
        return np.array(outputs[self.compiled.output(IMAGE_EMBEDS)], dtype=np.float32, copy=True)

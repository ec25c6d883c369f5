"""What a processor hands on for one image: the vision tower's inputs, how many placeholder tokens the prompt holds for
it and their text, and a hash of the tower's input that identifies the image's embeddings."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from ovbuild.errors import RequestError


@dataclass(frozen=True)
class ProcessedImage:
    """One image, ready for its family's vision tower.

    pixel_values: Qwen: [patches, channels * temporal_patch * patch * patch] in merge-window order;
                  MiniCPM-V: [1, channels, patch, slices' patches * patch] (each slice's patches row-major, packed)
    grid:         Qwen: image_grid_thw [1, 3] (t, h, w in patches); MiniCPM-V: target_sizes [slices, 2] (h, w)
    slices:       MiniCPM-V: (rows, cols) of the slice grid, (0, 0) when the source alone is used; Qwen: (0, 0)
    num_tokens:   image-token positions the prompt holds for this image (= embeddings the tower returns for it)
    placeholder:  the text that replaces the image token of a rendered prompt (before any per-prompt image id)
    content_hash: sha256 of the processor's settings and the resized uint8 crops the pixel values are computed from
                  (a fraction of the floats' size): equal images share one encoding (and cache entries), different
                  images behind the same placeholder ids never do
    """

    family: str
    pixel_values: np.ndarray
    grid: np.ndarray
    slices: tuple[int, int]
    num_tokens: int
    placeholder: str
    content_hash: str


def content_hash(settings: object, crops: list[np.ndarray]) -> str:
    """sha256 over a processor's settings (its repr) and the uint8 crops it normalises, shapes included: the pixel
    values are a function of exactly these."""
    h = hashlib.sha256(repr(settings).encode())
    for crop in crops:
        h.update(str((crop.dtype.str, crop.shape)).encode())
        h.update(np.ascontiguousarray(crop).tobytes())
    return h.hexdigest()


def expand_image_tokens(prompt: str, image_token: str, replacements: list[str]) -> str:
    """Replace the k-th `image_token` of a rendered prompt by `replacements[k]`, as transformers' processors do; the
    counts must agree."""
    parts = prompt.split(image_token)
    if len(parts) - 1 != len(replacements):
        raise RequestError(
            f"the prompt has {len(parts) - 1} image placeholder(s) ({image_token}) but {len(replacements)} image(s)",
            param="messages",
        )
    out = [parts[0]]
    for replacement, part in zip(replacements, parts[1:], strict=True):
        out += [replacement, part]
    return "".join(out)

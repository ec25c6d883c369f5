"""Resize, rescale and normalise as transformers' PIL backend does, operation for operation, so the floats agree bit for
bit: Pillow resizes the uint8 image, `rescale` multiplies in float64 and casts to float32, `normalize` subtracts and
divides in float32."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from PIL import Image

# Pillow's filter numbers, as preprocessor_config.json writes `resample` (PILImageResampling).
RESAMPLE_NAMES = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}


def resize(image: Image.Image, height: int, width: int, resample: int) -> Image.Image:
    """Pillow's resize to (height, width) with filter `resample` (3 = bicubic), no reducing gap."""
    return image.resize((width, height), resample=resample)


def to_chw(image: Image.Image) -> np.ndarray:
    """An RGB image as uint8 [channels, height, width]."""
    return np.asarray(image, dtype=np.uint8).transpose(2, 0, 1)  # [H, W, C] -> [C, H, W]


def rescale_normalize(
    chw: np.ndarray, rescale_factor: float, mean: tuple[float, ...], std: tuple[float, ...]
) -> np.ndarray:
    """uint8 [C, H, W] -> float32 (x * rescale_factor - mean) / std, rounded where transformers rounds."""
    x = (chw.astype(np.float64) * rescale_factor).astype(np.float32)  # transformers' rescale: upcast, then float32
    mean32 = np.asarray(mean, dtype=np.float32)[:, None, None]
    std32 = np.asarray(std, dtype=np.float32)[:, None, None]
    return (x - mean32) / std32

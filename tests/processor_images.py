"""The images the processor tests and tools/record_processor_outputs.py share: seeded noise over gradients at odd
sizes, and the statistics both sides compute of a processor's pixel output (one patch per row)."""

from __future__ import annotations

import hashlib

import numpy as np

# (width, height): tall and narrow, a photo's shape, a sliver, the classic square, two that MiniCPM-V slices, and a
# camera frame.
SIZES = [(37, 91), (500, 333), (1024, 17), (224, 224), (1200, 700), (449, 1500), (3000, 2000)]
SAMPLED_ROWS = 6  # full patch rows kept per case, evenly spaced


def picture(width: int, height: int, seed: int = 0) -> np.ndarray:
    """uint8 [height, width, 3]: horizontal, vertical and diagonal ramps per channel plus seeded noise."""
    rng = np.random.default_rng(seed + 1000 * width + height)
    y = np.linspace(0.0, 1.0, height)[:, None]
    x = np.linspace(0.0, 1.0, width)[None, :]
    ramps = np.stack([200 * x + 0 * y, 200 * y + 0 * x, 100 * (x + y)], axis=-1)  # [H, W, 3]
    noise = rng.integers(0, 56, size=(height, width, 3))
    return np.clip(ramps + noise, 0, 255).astype(np.uint8)


def pixels_sha256(pixels: np.ndarray) -> str:
    """sha256 of an image's bytes, to show both sides generated the same picture."""
    return hashlib.sha256(np.ascontiguousarray(pixels).tobytes()).hexdigest()


def minicpmv_rows(pixel_values: np.ndarray, patch: int) -> np.ndarray:
    """MiniCPM-V's [1, C, P, n * P] strip -> one patch per row, [n, C * P * P]."""
    _, channels, p, length = pixel_values.shape
    x = pixel_values[0].reshape(channels, p, length // patch, patch)  # [C, P, n, P]
    return x.transpose(2, 0, 1, 3).reshape(length // patch, channels * p * patch)  # -> [n, C*P*P]


def row_statistics(rows: np.ndarray) -> dict[str, np.ndarray]:
    """Per-row sum and a per-row weighted sum (weights vary along the row, so a reordering inside a patch shows), in
    float64, plus a few whole rows."""
    weights = np.cos(np.arange(rows.shape[1]) * 0.37)
    picked = np.linspace(0, len(rows) - 1, SAMPLED_ROWS).astype(np.int64)
    return {
        "row_sum": rows.astype(np.float64).sum(axis=1),
        "row_dot": rows.astype(np.float64) @ weights,
        "sampled_index": picked,
        "sampled_rows": rows[picked].astype(np.float32),
    }

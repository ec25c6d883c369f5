"""The vision tower of the tiny Qwen3.5-family vision-language checkpoints, laid out as the published ones hold it
(`vision_config` keys, `model.visual.*` tensor names), deterministic by seed.

Geometry: 2 blocks of width 32 with 2 heads (head_dim 16, so each rotary quarter holds 4 angles), patches of
2 x 2 x 2 (temporal) over 3 channels, 2 x 2 merge windows, a 6 x 6 learned position grid (resampled to every image
grid, smaller and larger) and output tokens 64 wide, the tiny language model's hidden size.
"""

from __future__ import annotations

import numpy as np

from ovbuild.weights.vision_qwen import QWEN_VISION_TABLE, parse_qwen_vision_config, qwen_vision_shapes

# As the published config.json writes it (Qwen3.5's own keys, transformers' names).
TINY_QWEN_VISION = dict(
    model_type="qwen3_5",
    deepstack_visual_indexes=[],
    depth=2,
    hidden_act="gelu_pytorch_tanh",
    hidden_size=32,
    in_channels=3,
    initializer_range=0.02,
    intermediate_size=48,
    num_heads=2,
    num_position_embeddings=36,
    out_hidden_size=64,
    patch_size=2,
    spatial_merge_size=2,
    temporal_patch_size=2,
)
PREFIX = "model.visual."
VISION_SEED_OFFSET = 3000  # the tower's tensors come from a generator of their own: the text tensors stay as before


def qwen_vision_tensors(vision: dict, architecture: str, seed: int) -> dict[str, np.ndarray]:
    """Every `model.visual.*` tensor of a tower with the `vision_config` `vision`, random but well scaled."""
    cfg = parse_qwen_vision_config({"architectures": [architecture], "vision_config": vision}, "tiny vision_config")
    rng = np.random.default_rng(seed + VISION_SEED_OFFSET)
    tensors = {}
    for canonical, shape in qwen_vision_shapes(cfg).items():
        for i in range(cfg.depth) if canonical.startswith("layers.") else [None]:
            name = canonical.format(i=i) if i is not None else canonical
            tensors[PREFIX + QWEN_VISION_TABLE[canonical].format(i=i)] = _tensor(rng, name, shape)
    return tensors


def _tensor(rng: np.random.Generator, name: str, shape: tuple[int, ...]) -> np.ndarray:
    if name.endswith("norm1.weight") or name.endswith(("norm2.weight", "norm.weight")):
        return (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
    if name.endswith("bias"):
        return (0.1 * rng.standard_normal(shape)).astype(np.float32)
    if name == "pos_embed":
        return (0.5 * rng.standard_normal(shape)).astype(np.float32)
    fan_in = int(np.prod(shape[1:]))  # a Conv3d kernel's inputs are all but its first axis
    return (rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32)

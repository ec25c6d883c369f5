"""The Qwen3.5-family vision tower (Qwen3_5ForConditionalGeneration, Qwen3_5MoeForConditionalGeneration): its
config, read from config.json's nested `vision_config`, and its tensor names.

Both architectures hold the same tower (transformers' Qwen3_5VisionModel, derived from Qwen3-VL's without the
deepstack mergers) under `model.visual.`: a Conv3d patch embedding, a learned square position grid resampled to
each image, `depth` pre-norm blocks (LayerNorm, attention with a fused qkv bias and 2-D rotary positions, MLP) and
one patch merger. Absent keys take transformers' defaults, as the published checkpoints rely on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ovbuild.errors import ConfigError, UnsupportedError
from ovbuild.weights.checkpoint import Checkpoint
from ovbuild.weights.config_reader import ConfigReader
from ovbuild.weights.tensor_names import WeightSource, stored_prefix

QWEN_VISION_ARCHITECTURES = ("Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration")
# The MLP activations transformers' ACT2FN names, as the graph and the reference know them.
VISION_ACTIVATIONS = ("gelu_pytorch_tanh", "gelu", "gelu_new", "silu", "quick_gelu")
LAYER_NORM_EPS = 1e-6  # fixed in the modeling code (nn.LayerNorm(..., eps=1e-6)), not a config key
DEFAULT_ROPE_THETA = 10000.0
# Where the tower's tensors sit, tried in this order; the first holding the patch embedding is the checkpoint's.
VISION_PREFIXES = ("model.visual.", "visual.")


@dataclass(frozen=True, kw_only=True)
class QwenVisionConfig:
    """Geometry of a Qwen3.5-family vision tower: the single source of every shape in its graph and reference."""

    depth: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    in_channels: int
    patch_size: int
    temporal_patch_size: int
    spatial_merge_size: int
    out_hidden_size: int  # the language model's hidden size: one merged token per spatial_merge_size^2 patches
    num_position_embeddings: int  # a square grid of learned positions, resampled to each image
    hidden_act: str
    rope_theta: float
    architecture: str
    family: str = "qwen3_5_vision"

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def patch_dim(self) -> int:
        """Values of one flattened patch: channels x temporal x patch x patch, in that order."""
        return self.in_channels * self.temporal_patch_size * self.patch_size * self.patch_size

    @property
    def grid_side(self) -> int:
        """Side of the learned position grid."""
        return math.isqrt(self.num_position_embeddings)

    @property
    def merge_unit(self) -> int:
        """Patches merged into one output token."""
        return self.spatial_merge_size * self.spatial_merge_size

    @property
    def merged_hidden_size(self) -> int:
        return self.hidden_size * self.merge_unit


def parse_qwen_vision_config(config: dict, path: str) -> QwenVisionConfig:
    """Normalize the `vision_config` of a Qwen3.5-family config.json."""
    root = ConfigReader(config, path)
    arch = root.architecture()
    if arch not in QWEN_VISION_ARCHITECTURES:
        raise UnsupportedError(f"{root.where('architectures')}: {arch!r} has no Qwen3.5-family vision tower")
    v = root.section("vision_config")
    if v is None:
        raise ConfigError(f"{root.where('vision_config')} is missing: {arch} carries a vision tower")
    hidden = v.int("hidden_size", 1152, minimum=1)
    heads = v.int("num_heads", 16, minimum=1)
    if hidden % heads or (hidden // heads) % 4:
        # the 2-D rotary turns each head in quarters: height, width, height, width
        raise ConfigError(
            f"{v.where('num_heads')} = {heads}: hidden_size {hidden} / num_heads must be a whole multiple of 4"
        )
    positions = v.int("num_position_embeddings", 2304, minimum=1)
    if math.isqrt(positions) ** 2 != positions:
        raise ConfigError(f"{v.where('num_position_embeddings')} = {positions} is not a square grid")
    act = v.str("hidden_act", "gelu_pytorch_tanh")
    if act not in VISION_ACTIVATIONS:
        raise UnsupportedError(f"{v.where('hidden_act')}: '{act}' is not one of {', '.join(VISION_ACTIVATIONS)}")
    if v.raw("deepstack_visual_indexes", []):
        # Qwen3_5VisionModel has no deepstack mergers (Qwen3-VL's do): a list here names layers nothing reads
        raise UnsupportedError(f"{v.where('deepstack_visual_indexes')}: the Qwen3.5 vision tower has no deepstack")
    return QwenVisionConfig(
        depth=v.int("depth", 27, minimum=1),
        hidden_size=hidden,
        intermediate_size=v.int("intermediate_size", 4304, minimum=1),
        num_heads=heads,
        in_channels=v.int("in_channels", 3, minimum=1),
        patch_size=_square(v, "patch_size", 16),
        temporal_patch_size=_square(v, "temporal_patch_size", 2),
        spatial_merge_size=v.int("spatial_merge_size", 2, minimum=1),
        out_hidden_size=v.int("out_hidden_size", 3584, minimum=1),
        num_position_embeddings=positions,
        hidden_act=act,
        rope_theta=_rope_theta(v),
        architecture=arch,
    )


def _square(v: ConfigReader, key: str, default: int) -> int:
    """A patch extent: an integer, or a list of equal integers (transformers types it `int | list[int]`)."""
    value = v.raw(key, default)
    if isinstance(value, list) and value and all(x == value[0] for x in value):
        value = value[0]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{v.where(key)} must be a positive integer (or a list of equal ones), got {value!r}")
    return value


def _rope_theta(v: ConfigReader) -> float:
    """The rotary base: `rope_parameters.rope_theta` (axial rope, the only kind the tower has), else 10000."""
    params = v.section("rope_parameters")
    if params is None:
        return v.float("rope_theta", DEFAULT_ROPE_THETA)
    rope_type = params.str("rope_type", "axial")
    if rope_type not in ("axial", "default"):
        raise UnsupportedError(f"{params.where('rope_type')}: '{rope_type}' (the vision tower's rope is axial)")
    return params.float("rope_theta", DEFAULT_ROPE_THETA)


# Canonical name -> name under the tower's prefix, as Qwen3_5VisionModel's modules hold them; `{i}` is a block.
QWEN_VISION_TABLE = {
    "patch_embed.weight": "patch_embed.proj.weight",
    "patch_embed.bias": "patch_embed.proj.bias",
    "pos_embed": "pos_embed.weight",
    **{
        f"layers.{{i}}.{name}.{part}": f"blocks.{{i}}.{name}.{part}"
        for name in ("norm1", "norm2", "attn.qkv", "attn.proj", "mlp.linear_fc1", "mlp.linear_fc2")
        for part in ("weight", "bias")
    },
    **{
        f"merger.{name}.{part}": f"merger.{name}.{part}"
        for name in ("norm", "linear_fc1", "linear_fc2")
        for part in ("weight", "bias")
    },
}


def qwen_vision_shapes(cfg: QwenVisionConfig) -> dict[str, tuple[int, ...]]:
    """Canonical name -> shape, as transformers' modules hold each tensor."""
    h, inter, merged = cfg.hidden_size, cfg.intermediate_size, cfg.merged_hidden_size
    p, t = cfg.patch_size, cfg.temporal_patch_size
    shapes = {
        "patch_embed.weight": (h, cfg.in_channels, t, p, p),  # Conv3d: [out, in, T, P, P]
        "patch_embed.bias": (h,),
        "pos_embed": (cfg.num_position_embeddings, h),
        "layers.{i}.norm1.weight": (h,),
        "layers.{i}.norm1.bias": (h,),
        "layers.{i}.norm2.weight": (h,),
        "layers.{i}.norm2.bias": (h,),
        "layers.{i}.attn.qkv.weight": (3 * h, h),  # queries, keys, values, each head by head
        "layers.{i}.attn.qkv.bias": (3 * h,),
        "layers.{i}.attn.proj.weight": (h, h),
        "layers.{i}.attn.proj.bias": (h,),
        "layers.{i}.mlp.linear_fc1.weight": (inter, h),
        "layers.{i}.mlp.linear_fc1.bias": (inter,),
        "layers.{i}.mlp.linear_fc2.weight": (h, inter),
        "layers.{i}.mlp.linear_fc2.bias": (h,),
        "merger.norm.weight": (h,),  # before the merge: over each patch
        "merger.norm.bias": (h,),
        "merger.linear_fc1.weight": (merged, merged),
        "merger.linear_fc1.bias": (merged,),
        "merger.linear_fc2.weight": (cfg.out_hidden_size, merged),
        "merger.linear_fc2.bias": (cfg.out_hidden_size,),
    }
    return shapes


def vision_prefix(checkpoint: Checkpoint) -> str:
    """The prefix of the vision tower's tensors in this checkpoint."""
    return stored_prefix(checkpoint, VISION_PREFIXES, QWEN_VISION_TABLE["patch_embed.weight"], "vision patch embedding")


def load_qwen_vision(checkpoint: Checkpoint) -> tuple[QwenVisionConfig, WeightSource]:
    """Normalized vision config and tensor source of a Qwen3.5-family vision-language checkpoint."""
    cfg = parse_qwen_vision_config(checkpoint.config, str(checkpoint.config_path))
    prefix = vision_prefix(checkpoint)
    return cfg, WeightSource(checkpoint, {k: f"{prefix}{v}" for k, v in QWEN_VISION_TABLE.items()})

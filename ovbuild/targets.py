"""Target families, each declared once with every part ovbuild needs of it, next to the draft families
(`ovbuild.families`); every per-target table derives from here.

A target family's parts live one per layer: checkpoint layout and config in `weights/` (a `TargetLayout`), graph
builders per IR format in `graph/`, tiny checkpoints in `testing/`; its numpy reference is registered with it from
the testing side (`ovbuild.testing.references`). The runtime needs none of this: a target IR carries what running it
takes (its ports, and its linear-attention states as STATE ports). Adding a target: docs/adding_a_model.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Protocol

import openvino as ov

from ovbuild.errors import UnsupportedError
from ovbuild.families import declared_family, family_builder
from ovbuild.graph.genai.target import build_genai_target
from ovbuild.graph.hybrid_target import build_hybrid_target
from ovbuild.graph.target import build_target
from ovbuild.graph.vision.minicpm import build_minicpm_vision
from ovbuild.graph.vision.qwen3_5 import build_qwen_vision
from ovbuild.graph.weights import WeightPolicy
from ovbuild.ir import MODEL_STEM
from ovbuild.ir.ports import CONV_STATE, RECURRENT_STATE, Port
from ovbuild.testing.tiny import write_tiny_target
from ovbuild.testing.tiny_hybrid import write_tiny_hybrid_target
from ovbuild.testing.tiny_minicpm_vision import write_tiny_minicpm_vision
from ovbuild.testing.tiny_moe import write_tiny_moe_target
from ovbuild.weights.checkpoint import Checkpoint
from ovbuild.weights.config_reader import ConfigReader
from ovbuild.weights.hybrid import HYBRID_LAYOUT, HybridTargetConfig
from ovbuild.weights.target import QWEN3_LAYOUT, TargetConfig, TargetLayout
from ovbuild.weights.tensor_names import WeightSource
from ovbuild.weights.vision_minicpm import ARCHITECTURE as MINICPMV4_7
from ovbuild.weights.vision_minicpm import MiniCPMVisionConfig, MiniCPMVisionWeights, load_minicpm_vision
from ovbuild.weights.vision_qwen import QWEN_VISION_ARCHITECTURES, load_qwen_vision

# Every IR of a target folder keyed by file stem, from (config, weights, the layers tapped for a draft, policy).
TargetBuilder = Callable[[TargetConfig, WeightSource, tuple[int, ...], WeightPolicy], dict[str, ov.Model]]


@dataclass(frozen=True)
class TargetFamily:
    """One target family: how its checkpoints are read, built in each IR format and faked."""

    name: str  # TargetConfig.family and the IRs' `ovbuild/family`
    layouts: tuple[TargetLayout, ...]  # the checkpoint layouts it reads (architecture names, parser, loader)
    config: type[TargetConfig]  # the class its parsers return
    builders: Mapping[str, TargetBuilder]  # IR format (export.ir_formats.IR_FORMATS) -> the folder's IRs
    states: tuple[Port, ...]  # per-sequence state inputs of its paged IR, one per layer that has them
    tiny: Mapping[str, Callable[[Path], Path]]  # tiny checkpoint writers by name, one per published layout


def _paged(build: Callable[..., ov.Model]) -> TargetBuilder:
    def builder(cfg: TargetConfig, weights: WeightSource, taps: tuple[int, ...], policy: WeightPolicy):
        return {MODEL_STEM: build(cfg, weights, taps, policy)}

    return builder


def _genai(cfg: TargetConfig, weights: WeightSource, taps: tuple[int, ...], policy: WeightPolicy):
    # GenAI locates every layer's output through rt_info and picks the draft's taps itself at load time.
    return {MODEL_STEM: build_genai_target(cfg, weights, policy)}


QWEN3 = TargetFamily(
    name="qwen3",
    layouts=(QWEN3_LAYOUT,),
    config=TargetConfig,
    builders={"paged": _paged(build_target), "genai": _genai},
    states=(),
    tiny={"qwen3": write_tiny_target},
)
QWEN3_5 = TargetFamily(
    name="qwen3_5",  # Qwen3.5-family hybrids: Gated DeltaNet layers between gated full-attention layers
    layouts=(HYBRID_LAYOUT,),
    config=HybridTargetConfig,
    builders={"paged": _paged(build_hybrid_target)},
    states=(CONV_STATE, RECURRENT_STATE),
    tiny={
        "qwen3_5": write_tiny_hybrid_target,
        "qwen3_5_text": partial(write_tiny_hybrid_target, text_only=True),
        "qwen3_5_moe": write_tiny_moe_target,
        "qwen3_5_moe_per_expert": partial(write_tiny_moe_target, per_expert=True),
        # the vision-language checkpoints whole: the export writes their vision tower beside the target
        "minicpmv4_7_1b": partial(write_tiny_minicpm_vision, kind="1b"),
        "minicpmv4_7_a3b": partial(write_tiny_minicpm_vision, kind="a3b"),
    },
)

TARGETS: tuple[TargetFamily, ...] = (QWEN3, QWEN3_5)
# Architectures recognized as targets that no family reads, so that they fail with a clear message.
REFUSED: dict[str, str] = {
    "Qwen3NextForCausalLM": "a mixture-of-experts MLP and fused in_proj_qkvz / in_proj_ba (qwen3_next)",
}

# Derived tables.
BY_NAME: dict[str, TargetFamily] = {f.name: f for f in TARGETS}
BY_ARCHITECTURE: dict[str, tuple[TargetFamily, TargetLayout]] = {
    a: (f, layout) for f in TARGETS for layout in f.layouts for a in layout.architectures
}
SUPPORTED_TARGET_ARCHITECTURES: tuple[str, ...] = tuple(BY_ARCHITECTURE)
TARGET_ARCHITECTURES: tuple[str, ...] = (*SUPPORTED_TARGET_ARCHITECTURES, *REFUSED)


class VisionConfig(Protocol):
    """What the declarations read of a tower's normalized config (each tower's own class holds the rest)."""

    family: str
    depth: int  # blocks, which the export's progress follows


@dataclass(frozen=True)
class VisionTower:
    """The vision tower of vision-language targets, exported as its own IR beside the target (ir.VISION_FILE): how
    its config and tensors are read and how its IR is built. The language model is the target family's."""

    name: str  # its config's family and the IR's `ovbuild/family`
    architectures: tuple[str, ...]  # the target architectures that carry it
    load: Callable[[Checkpoint], tuple[VisionConfig, WeightSource]]  # (normalized vision config, tensor source)
    build: Callable[[VisionConfig, WeightSource, WeightPolicy], ov.Model]


QWEN3_5_VISION = VisionTower(
    name="qwen3_5_vision",  # Qwen3.5 dense and MoE vision-language models hold the same tower
    architectures=QWEN_VISION_ARCHITECTURES,
    load=load_qwen_vision,
    build=build_qwen_vision,
)


def _load_minicpm(checkpoint: Checkpoint) -> tuple[MiniCPMVisionConfig, WeightSource]:
    # the config's downsample_mode: one IR per mode (the other mode is a second build)
    cfg, weights = load_minicpm_vision(checkpoint)
    return cfg, weights.source


def _build_minicpm(cfg: MiniCPMVisionConfig, weights: WeightSource, policy: WeightPolicy) -> ov.Model:
    return build_minicpm_vision(cfg, MiniCPMVisionWeights(weights, cfg), policy)


MINICPMV4_7_VISION = VisionTower(
    name="minicpmv4_7_vision",  # SigLIP-style tower, window merger and downsampling merger (1B and 35B-A3B alike)
    architectures=(MINICPMV4_7,),
    load=_load_minicpm,
    build=_build_minicpm,
)
VISION_TOWERS: tuple[VisionTower, ...] = (QWEN3_5_VISION, MINICPMV4_7_VISION)
VISION_BY_ARCHITECTURE: dict[str, VisionTower] = {a: v for v in VISION_TOWERS for a in v.architectures}


def find_vision_tower(config: dict, path: str) -> VisionTower | None:
    """The vision tower a target's config.json carries (by `architectures[0]`), None for a text-only target."""
    return VISION_BY_ARCHITECTURE.get(ConfigReader(config, path).architecture())


def find_target(config: dict, path: str) -> tuple[TargetFamily, TargetLayout]:
    """The family and layout of a target's config.json (read from `path`), by `architectures[0]`."""
    r = ConfigReader(config, path)
    arch = r.architecture()
    if arch in REFUSED:
        raise UnsupportedError(f"{r.where('architectures')}: {arch} has {REFUSED[arch]}, not supported")
    if arch not in BY_ARCHITECTURE:
        raise UnsupportedError(
            f"{r.where('architectures')}: unknown target architecture {arch!r} "
            f"(supported: {', '.join(SUPPORTED_TARGET_ARCHITECTURES)})"
        )
    return BY_ARCHITECTURE[arch]


def parse_target_config(config: dict, path: str) -> TargetConfig:
    """The normalized config of a target's config.json (read from `path`)."""
    return find_target(config, path)[1].parse(config, path)


def load_target(checkpoint: Checkpoint) -> tuple[TargetConfig, WeightSource]:
    """Normalized config and tensor source of a target checkpoint."""
    return find_target(checkpoint.config, str(checkpoint.config_path))[1].load(checkpoint)


def target_family(name: str) -> TargetFamily:
    """The target family declared as `name` (a TargetConfig's family, a target IR's `ovbuild/family`)."""
    return declared_family("target", TARGETS, name)


def target_builder(cfg: TargetConfig, ir_format: str = "paged") -> TargetBuilder:
    """The builder of a target's IRs in `ir_format`; an error when its family does not have that format."""
    return family_builder("target", TARGETS, cfg, ir_format)


def build_target_models(
    cfg: TargetConfig,
    weights: WeightSource,
    target_layer_ids: tuple[int, ...] = (),
    policy: WeightPolicy | None = None,
    ir_format: str = "paged",
) -> dict[str, ov.Model]:
    """All IRs of a target in `ir_format`, keyed by file stem."""
    return target_builder(cfg, ir_format)(cfg, weights, tuple(target_layer_ids), policy or WeightPolicy())


def build_paged_target(
    cfg: TargetConfig, weights: WeightSource, target_layer_ids: tuple[int, ...] = (), policy: WeightPolicy | None = None
) -> ov.Model:
    """The paged target IR for `cfg` with the hidden states of `target_layer_ids` (a draft's taps)."""
    return build_target_models(cfg, weights, target_layer_ids, policy)[MODEL_STEM]

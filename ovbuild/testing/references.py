"""The numpy reference of every family's graphs, registered by family name (a draft's DraftConfig.family, a
target's TargetConfig.family): what the parity tests compare each built IR with. The references live in
ovbuild/reference/ and know nothing of the graphs; this registry is the testing side of each family's declaration."""

from __future__ import annotations

from ovbuild.reference import DFlash2Reference, DFlashReference, DSparkReference, Qwen3Reference
from ovbuild.reference.hybrid import HybridReference
from ovbuild.reference.vision_minicpm import MiniCPMVisionReference
from ovbuild.reference.vision_qwen import QwenVisionReference

# Drafts: reference(cfg, draft weights, target weights); targets: reference(cfg, weights).
REFERENCES: dict[str, type] = {
    "dflash": DFlashReference,
    "dflash2": DFlash2Reference,
    "dspark": DSparkReference,
    "qwen3": Qwen3Reference,
    "qwen3_5": HybridReference,
}
# Vision towers, by VisionTower.name: reference(vision config, weights).
VISION_REFERENCES: dict[str, type] = {
    "qwen3_5_vision": QwenVisionReference,
    "minicpmv4_7_vision": MiniCPMVisionReference,
}

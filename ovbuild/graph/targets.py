"""The paged target IR of any target checkpoint: the dense Qwen3 stack or the hybrid Qwen3.5 stack, by its config."""

from __future__ import annotations

import openvino as ov

from ovbuild.graph.hybrid_target import build_hybrid_target
from ovbuild.graph.target import build_target
from ovbuild.graph.weights import WeightPolicy
from ovbuild.weights.hybrid import HybridTargetConfig
from ovbuild.weights.target import TargetConfig
from ovbuild.weights.tensor_names import WeightSource


def build_paged_target(
    cfg: TargetConfig, weights: WeightSource, target_layer_ids: tuple[int, ...] = (), policy: WeightPolicy | None = None
) -> ov.Model:
    """The paged target IR for `cfg` with the hidden states of `target_layer_ids` (a draft's taps)."""
    build = build_hybrid_target if isinstance(cfg, HybridTargetConfig) else build_target
    return build(cfg, weights, target_layer_ids, policy)

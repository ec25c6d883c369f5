"""IR formats an export can write, by name: which builders make the target's and the draft's models.

Adding a format (e.g. stateful SDPA IRs for stock OpenVINO GenAI) is one entry in IR_FORMATS.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import openvino as ov

from ovbuild.contract import MODEL_STEM
from ovbuild.errors import UnsupportedError
from ovbuild.graph.genai.draft import build_genai_draft
from ovbuild.graph.genai.target import build_genai_target
from ovbuild.graph.hybrid_target import build_hybrid_target
from ovbuild.graph.registry import build_draft_models
from ovbuild.graph.target import build_target
from ovbuild.graph.weights import WeightPolicy
from ovbuild.weights.draft_config import DraftConfig
from ovbuild.weights.hybrid import HybridTargetConfig
from ovbuild.weights.target import TargetConfig
from ovbuild.weights.tensor_names import WeightSource

# Each returns every IR of the output folder keyed by file stem (MODEL_STEM, MARKOV_HEAD_STEM of ovbuild.contract).
TargetBuilder = Callable[[TargetConfig, WeightSource, tuple[int, ...], WeightPolicy], dict[str, ov.Model]]
# The target source is None when the draft carries its own embedding and lm_head and no target was given.
DraftBuilder = Callable[[DraftConfig, WeightSource, WeightSource | None, WeightPolicy], dict[str, ov.Model]]


@dataclass(frozen=True)
class IrFormat:
    """One kind of exported folder: a description for --help and the builders of its models."""

    description: str
    target: TargetBuilder
    draft: DraftBuilder
    # The draft IR holds the target's embedding and lm_head (a draft without its own then needs --target-model);
    # a runtime that grafts them on itself (GenAI) does not.
    draft_embeds_target: bool = True
    # The runtime opens a target folder through openvino_tokenizer.xml (GenAI): converting the tokenizer must succeed.
    needs_tokenizer_irs: bool = False


def _paged_target(
    cfg: TargetConfig, weights: WeightSource, taps: tuple[int, ...], policy: WeightPolicy
) -> dict[str, ov.Model]:
    build = build_hybrid_target if isinstance(cfg, HybridTargetConfig) else build_target
    return {MODEL_STEM: build(cfg, weights, taps, policy)}


def _genai_target(
    cfg: TargetConfig, weights: WeightSource, taps: tuple[int, ...], policy: WeightPolicy
) -> dict[str, ov.Model]:
    # GenAI locates every layer's output through rt_info and picks the draft's taps itself at load time.
    return {MODEL_STEM: build_genai_target(cfg, weights, policy)}


def _genai_draft(
    cfg: DraftConfig, draft: WeightSource, target: WeightSource | None, policy: WeightPolicy
) -> dict[str, ov.Model]:
    return {MODEL_STEM: build_genai_draft(cfg, draft, policy)}


IR_FORMATS: dict[str, IrFormat] = {
    "paged": IrFormat("PagedAttention IRs over packed rows of many sequences", _paged_target, build_draft_models),
    "genai": IrFormat(
        "stateful SDPA IRs that stock OpenVINO GenAI 2026.4 runs (DFlash v1 drafts, Qwen3 targets)",
        _genai_target,
        _genai_draft,
        draft_embeds_target=False,
        needs_tokenizer_irs=True,
    ),
}


def ir_format(name: str) -> IrFormat:
    """The IR_FORMATS entry `name`."""
    if name not in IR_FORMATS:
        raise UnsupportedError(f"IR format '{name}' is not one of {', '.join(IR_FORMATS)}")
    return IR_FORMATS[name]

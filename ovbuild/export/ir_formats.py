"""IR formats an export can write, by name: the target's builder and what the folder needs. A draft's builders per
format are part of its family's declaration (`ovbuild.families`).

Adding a format (e.g. stateful SDPA IRs for stock OpenVINO GenAI) is one entry in IR_FORMATS, plus a builder in the
declaration of each family that has the format.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import openvino as ov

from ovbuild.errors import UnsupportedError
from ovbuild.graph.genai.target import build_genai_target
from ovbuild.graph.targets import build_paged_target
from ovbuild.graph.weights import WeightPolicy
from ovbuild.ir import MODEL_STEM
from ovbuild.weights.target import TargetConfig
from ovbuild.weights.tensor_names import WeightSource

# Each returns every IR of the output folder keyed by file stem (MODEL_STEM, MARKOV_HEAD_STEM of ovbuild.ir).
TargetBuilder = Callable[[TargetConfig, WeightSource, tuple[int, ...], WeightPolicy], dict[str, ov.Model]]


@dataclass(frozen=True)
class IrFormat:
    """One kind of exported folder: a description for --help and the builder of a target's models."""

    description: str
    target: TargetBuilder
    # The draft IR holds the target's embedding and lm_head (a draft without its own then needs --target-model);
    # a runtime that grafts them on itself (GenAI) does not.
    draft_embeds_target: bool = True
    # The runtime opens a target folder through openvino_tokenizer.xml (GenAI): converting the tokenizer must succeed.
    needs_tokenizer_irs: bool = False


def _paged_target(
    cfg: TargetConfig, weights: WeightSource, taps: tuple[int, ...], policy: WeightPolicy
) -> dict[str, ov.Model]:
    return {MODEL_STEM: build_paged_target(cfg, weights, taps, policy)}


def _genai_target(
    cfg: TargetConfig, weights: WeightSource, taps: tuple[int, ...], policy: WeightPolicy
) -> dict[str, ov.Model]:
    # GenAI locates every layer's output through rt_info and picks the draft's taps itself at load time.
    return {MODEL_STEM: build_genai_target(cfg, weights, policy)}


IR_FORMATS: dict[str, IrFormat] = {
    "paged": IrFormat("PagedAttention IRs over packed rows of many sequences", _paged_target),
    "genai": IrFormat(
        "stateful SDPA IRs that stock OpenVINO GenAI 2026.4 runs (DFlash v1 drafts, Qwen3 targets)",
        _genai_target,
        draft_embeds_target=False,
        needs_tokenizer_irs=True,
    ),
}


def ir_format(name: str) -> IrFormat:
    """The IR_FORMATS entry `name`."""
    if name not in IR_FORMATS:
        raise UnsupportedError(f"IR format '{name}' is not one of {', '.join(IR_FORMATS)}")
    return IR_FORMATS[name]

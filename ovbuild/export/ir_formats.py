"""IR formats an export can write, by name, and what the folder needs. The builders per format are part of each
family's declaration: a draft's in `ovbuild.families`, a target's in `ovbuild.targets`.

Adding a format (e.g. stateful SDPA IRs for stock OpenVINO GenAI) is one entry in IR_FORMATS, plus a builder in the
declaration of each family that has the format.
"""

from __future__ import annotations

from dataclasses import dataclass

from ovbuild.errors import UnsupportedError


@dataclass(frozen=True)
class IrFormat:
    """One kind of exported folder: a description for --help and what its folders need."""

    description: str
    # The draft IR holds the target's embedding and lm_head (a draft without its own then needs --target-model);
    # a runtime that grafts them on itself (GenAI) does not.
    draft_embeds_target: bool = True
    # The runtime opens a target folder through openvino_tokenizer.xml (GenAI): converting the tokenizer must succeed.
    needs_tokenizer_irs: bool = False


IR_FORMATS: dict[str, IrFormat] = {
    "paged": IrFormat("PagedAttention IRs over packed rows of many sequences"),
    "genai": IrFormat(
        "stateful SDPA IRs that stock OpenVINO GenAI 2026.4 runs (DFlash v1 drafts, Qwen3 targets)",
        draft_embeds_target=False,
        needs_tokenizer_irs=True,
    ),
}


def ir_format(name: str) -> IrFormat:
    """The IR_FORMATS entry `name`."""
    if name not in IR_FORMATS:
        raise UnsupportedError(f"IR format '{name}' is not one of {', '.join(IR_FORMATS)}")
    return IR_FORMATS[name]

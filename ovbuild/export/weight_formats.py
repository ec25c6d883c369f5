"""Weight formats an export accepts, which of them the weight policy supports today, and the default per kind."""

from __future__ import annotations

from ovbuild.errors import UnsupportedError
from ovbuild.graph.weights import WeightPolicy

# keep = the checkpoint's own precision (bf16 checkpoints stay bf16); int8 / int4 are integer compression.
WEIGHT_FORMATS = ("keep", "fp32", "fp16", "int8", "int4")
# The single place defaults are decided: the first format of each list that the policy supports. Targets keep the
# checkpoint precision (their quality is the reference); drafts are small and memory-bound, so int8 once it exists.
PREFERRED_DEFAULTS = {"target": ("keep",), "draft": ("int8", "keep")}


def supports(weight_format: str) -> bool:
    """Whether the weight policy accepts `weight_format` (formats land in the policy one by one)."""
    try:
        WeightPolicy(weight_format=weight_format)
    except UnsupportedError:
        return False
    return True


def supported_weight_formats() -> tuple[str, ...]:
    """The export formats the weight policy supports, in WEIGHT_FORMATS order."""
    return tuple(f for f in WEIGHT_FORMATS if supports(f))


def default_weight_format(kind: str) -> str:
    """The weight format used when none is given, for kind "target" or "draft"."""
    return next(f for f in PREFERRED_DEFAULTS[kind] if supports(f))


def make_policy(
    weight_format: str, sym: bool | None = None, group_size: int | None = None, all_layers: bool | None = None
) -> WeightPolicy:
    """The WeightPolicy of an export; options left as None keep the policy's own defaults."""
    if weight_format not in WEIGHT_FORMATS:
        raise UnsupportedError(f"weight format '{weight_format}' is not one of {', '.join(WEIGHT_FORMATS)}")
    options = dict(sym=sym, group_size=group_size, all_layers=all_layers)
    return WeightPolicy(weight_format=weight_format, **{k: v for k, v in options.items() if v is not None})

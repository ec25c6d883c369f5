"""Weight formats an export accepts, as optimum-cli names them, and the default per kind of checkpoint."""

from __future__ import annotations

from ovbuild.errors import UnsupportedError
from ovbuild.graph.weights import FLOAT_FORMATS, INT_FORMATS, WeightPolicy

# keep = the checkpoint's own precision (bf16 checkpoints stay bf16); int8 / int4 are integer compression. The
# policy's bf16 storage is for Python callers only: optimum-cli's --weight-format has no bf16.
WEIGHT_FORMATS = tuple(f for f in FLOAT_FORMATS if f != "bf16") + INT_FORMATS
# Targets keep the checkpoint precision (their output is the reference); drafts are small and memory-bound, so int8
# (int4 costs a small draft too much acceptance).
DEFAULTS = {"target": "keep", "draft": "int8"}


def default_weight_format(kind: str) -> str:
    """The weight format used when none is given, for kind "target" or "draft"."""
    return DEFAULTS[kind]


def make_policy(
    weight_format: str, sym: bool | None = None, group_size: int | None = None, all_layers: bool | None = None
) -> WeightPolicy:
    """The WeightPolicy of an export; options left as None keep the policy's own defaults."""
    if weight_format not in WEIGHT_FORMATS:
        raise UnsupportedError(f"weight format '{weight_format}' is not one of {', '.join(WEIGHT_FORMATS)}")
    options = dict(sym=sym, group_size=group_size, all_layers=all_layers)
    return WeightPolicy(weight_format=weight_format, **{k: v for k, v in options.items() if v is not None})

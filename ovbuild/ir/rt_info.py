"""Model rt_info as nested keys by slash path; which keys an IR carries is `ovbuild.ir.records`' business."""

from __future__ import annotations

import openvino as ov


def set_rt_info(model: ov.Model, values: dict[str, object]) -> None:
    """Write `{"a/b": 16, ...}` as nested rt_info (slashes become levels); lists become "1,9,17"."""
    for key, value in values.items():
        if isinstance(value, (list, tuple)):
            value = ",".join(str(v) for v in value)
        model.set_rt_info(str(value), key.split("/"))


def get_rt_info(model: ov.Model, key: str, default: str | None = None) -> str | None:
    """A string rt_info value by slash path, or `default` when absent."""
    path = key.split("/")
    return model.get_rt_info(path).astype(str) if model.has_rt_info(path) else default


def flat_rt_info(model: ov.Model) -> dict[str, str]:
    """All of a model's rt_info as {"a/b": "value", ...} (what `inspect` lists)."""
    return _flatten(model.get_rt_info())


def _flatten(rt, prefix: str = "") -> dict[str, str]:
    out = {}
    for key in rt:
        value = rt[key]
        if isinstance(value, dict):
            out |= _flatten(value, f"{prefix}{key}/")
        else:
            out[f"{prefix}{key}"] = value.astype(str) if isinstance(value, ov.OVAny) else str(value)
    return out

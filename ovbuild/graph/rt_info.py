"""Model rt_info: everything needed to run an IR (and to restore what the IR format drops) is written here."""

from __future__ import annotations

import openvino as ov

from ovbuild import __version__


def set_rt_info(model: ov.Model, values: dict[str, object]) -> None:
    """Write `{"dflash/block_size": 16, ...}` as nested rt_info (slashes become levels); lists become "1,9,17"."""
    for key, value in values.items():
        if isinstance(value, (list, tuple)):
            value = ",".join(str(v) for v in value)
        model.set_rt_info(str(value), key.split("/"))


def get_rt_info(model: ov.Model, key: str, default: str | None = None) -> str | None:
    """A string rt_info value by slash path, or `default` when absent."""
    path = key.split("/")
    return model.get_rt_info(path).astype(str) if model.has_rt_info(path) else default


def common_rt_info(
    kind: str, family: str, num_kv_heads: int | None = None, head_dim: int | None = None
) -> dict[str, object]:
    """Keys every ovbuild IR carries: who built it, what it is, and the PagedAttention head geometry if it has any."""
    info: dict[str, object] = {
        "ovbuild/version": __version__,
        "ovbuild/openvino_version": ov.get_version(),
        "ovbuild/kind": kind,
        "ovbuild/family": family,
    }
    if num_kv_heads is not None:
        info.update({"pa/num_kv_heads": num_kv_heads, "pa/head_size": head_dim})
    return info

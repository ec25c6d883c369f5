"""Checkpoint tensor names kept as data: one table per architecture, canonical name -> name in the checkpoint.

Canonical names are the draft's own names without `.weight` (`layers.3.self_attn.q_proj`); `{i}` is a layer index.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from ovbuild.errors import TensorError
from ovbuild.weights.checkpoint import Checkpoint
from ovbuild.weights.tensor import WeightTensor

QWEN3_LAYER = (
    "input_layernorm",
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "self_attn.q_norm",
    "self_attn.k_norm",
    "post_attention_layernorm",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
)


def stored_prefix(checkpoint: Checkpoint, prefixes: tuple[str, ...], probe: str, what: str) -> str:
    """The first of `prefixes` under which the checkpoint holds the tensor `probe`: where a model's tensors sit in
    the checkpoints that nest it (a language model or a vision tower inside a vision-language model)."""
    for prefix in prefixes:
        if f"{prefix}{probe}" in checkpoint:
            return prefix
    tried = ", ".join(f"'{p}{probe}'" for p in prefixes)
    raise TensorError(f"{checkpoint.source}: no {what} found (looked for {tried})")


def layer_entries(prefix: str, names: tuple[str, ...] = QWEN3_LAYER) -> dict[str, str]:
    """Table rows for per-layer weights stored as `{prefix}layers.{i}.<name>.weight`."""
    return {f"layers.{{i}}.{n}": f"{prefix}layers.{{i}}.{n}.weight" for n in names}


_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")


class WeightSource:
    """Reads canonical tensors of one checkpoint through its architecture's name table."""

    def __init__(self, checkpoint: Checkpoint, table: Mapping[str, str]):
        self.checkpoint, self.table = checkpoint, dict(table)

    def lookup(self, canonical: str) -> str | None:
        """The checkpoint name of `canonical`, or None when this architecture's table has no row for it."""
        m = _LAYER.match(canonical)
        key = f"layers.{{i}}.{m.group(2)}" if m else canonical
        return self.table[key].format(i=m.group(1) if m else "") if key in self.table else None

    def checkpoint_name(self, canonical: str) -> str:
        name = self.lookup(canonical)
        if name is None:
            raise TensorError(f"{self.checkpoint.source}: no tensor '{canonical}' in this architecture's name table")
        return name

    def has(self, canonical: str) -> bool:
        """Whether the checkpoint holds `canonical` (False for a name the architecture does not have)."""
        name = self.lookup(canonical)
        return name is not None and name in self.checkpoint

    def get(self, canonical: str, shape: tuple[int, ...] | None = None) -> WeightTensor:
        """The checkpoint tensor behind `canonical`, shape-checked when `shape` is given."""
        return self.checkpoint.get(self.checkpoint_name(canonical), shape)

"""BuildContext: what every building block of one graph needs (geometry, weights, weight policy, attention)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import openvino.opset16 as ops

from ovbuild.graph.ops import Output, i64, named
from ovbuild.graph.paged_attention import AttentionBackend
from ovbuild.graph.rope import RotaryTables
from ovbuild.graph.weights import WeightPolicy, f32_constant
from ovbuild.weights.config import Backbone
from ovbuild.weights.tensor import WeightTensor
from ovbuild.weights.tensor_names import WeightSource


@dataclass
class BuildContext:
    """One graph under construction. Weight names are canonical (`layers.3.self_attn.q_proj`)."""

    cfg: Backbone
    weights: WeightSource
    policy: WeightPolicy
    attention: AttentionBackend  # PagedInputs for paged IRs; the stateful SDPA form plugs in its own
    rope: RotaryTables
    # Model inputs by name that building blocks may read besides their tensor argument: the packed-row layout
    # (`token_type_ids`, `subsequence_begins`) for blocks that must keep each row inside its own block.
    inputs: dict[str, Output] = field(default_factory=dict)
    # Drafts carry their residual stream on the block rows only (context rows just feed keys and values): the rows
    # of the attention's packed axis that queries come from [Tq] i64, and the RoPE tables at those rows (set both
    # with `queries_on`). None: all.
    query_rows: Output | None = None
    query_rope: RotaryTables | None = None

    # Weight nodes already built, by (checkpoint, tensor, scheme): a tied embedding and lm_head share one table.
    _matrices: dict[tuple, Output] = field(default_factory=dict)

    def matrix(self, source: WeightSource, name: str, shape: tuple[int, int], role: str = "linear") -> Output:
        """Checkpoint matrix `name` of `source` as an f32-valued node (through the weight policy), built once."""
        key = (id(source.checkpoint), source.checkpoint_name(name), self.policy.scheme(role))
        if key not in self._matrices:
            self._matrices[key] = self.policy.matrix(source.get(name, shape), path(name), role)
        return self._matrices[key]

    def linear(self, x: Output, name: str, out_features: int, in_features: int) -> Output:
        """x [T, in] @ W^T -> [T, out], W read as stored, named after the tensor (`layers.3/self_attn/q_proj`)."""
        w = self.matrix(self.weights, name, (out_features, in_features))
        return named(ops.matmul(x, w, False, True), path(name))

    def linears(self, x: Output, names: list[tuple[str, int]], in_features: int, fused_path: str) -> list[Output]:
        """Several projections of the same x [T, in] as one MatMul: `names` (tensor, out_features) -> one [T, out]
        output each. Their weights are stacked along the output axis when loading (each output row keeps its own
        scale and groups, so compressed codes are those of the separate matrices): one kernel call instead of
        several, which is most of a call's cost at small row counts."""
        tensors = [self.weights.get(name, (out, in_features)) for name, out in names]
        stacked = WeightTensor(tensors[0].name, tensors[0].dtype, np.concatenate([t.array for t in tensors]))
        w = self.policy.matrix(stacked, fused_path, "linear")
        y = named(ops.matmul(x, w, False, True), fused_path)  # [T, sum(out)]
        parts = ops.variadic_split(y, i64(-1), i64([out for _, out in names]))
        parts.set_friendly_name(f"{fused_path}/split")  # outputs in the order of `names`
        return list(parts.outputs())

    def queries_on(self, rows: Output) -> None:
        """Queries, and so the residual stream, only on `rows` [Tq] i64 of the packed axis; RoPE gathered there once."""
        self.query_rows = rows
        self.query_rope = RotaryTables(
            named(ops.gather(self.rope.cos, rows, i64(0)), "rope/block_cos"),  # [Tq, 1, D]
            named(ops.gather(self.rope.sin, rows, i64(0)), "rope/block_sin"),
        )

    def vector(self, name: str, size: int) -> Output:
        """A norm weight as an f32 Constant."""
        return f32_constant(self.weights.get(name, (size,)), f"{path(name)}/weight")


def path(name: str) -> str:
    """Canonical tensor name -> node path: `layers.3.self_attn.q_proj` -> `layers.3/self_attn/q_proj`."""
    if name.startswith("layers."):
        index, _, rest = name[len("layers.") :].partition(".")
        return f"layers.{index}/" + rest.replace(".", "/")
    return name.replace(".", "/")

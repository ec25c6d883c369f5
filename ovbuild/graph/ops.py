"""Small helpers over openvino.opset16: constants, parameters, path-like friendly names."""

from __future__ import annotations

import numpy as np
import openvino as ov
import openvino.opset16 as ops

from ovbuild.ir.ports import Port

Node = ov.Node
Output = ov.Output


def const(value, dtype=np.float32) -> Output:
    """A Constant from a Python scalar or list."""
    return ops.constant(np.array(value, dtype=dtype)).output(0)


def i64(value) -> Output:
    return const(value, np.int64)


def i32(value) -> Output:
    return const(value, np.int32)


def named(node: Node | Output, path: str) -> Output:
    """Give the node a path-like friendly name (`layers.3/self_attn/q_proj`) and return its first output."""
    node = node.get_node() if isinstance(node, ov.Output) else node
    node.set_friendly_name(path)
    return node.output(0)


def first_output(x: Node | Output) -> Output:
    """x's first output, or x itself if it is one (Loop ports take outputs, builders return either)."""
    return x.output(0) if isinstance(x, ov.Node) else x


def parameter(port: Port, shape: list[int], layer: int | None = None) -> ov.Node:
    """The model input `port` (of `layer`, for a per-layer port) of this shape (its rank declared with the port),
    whose tensor name equals its friendly name, so ports are found by name."""
    if len(shape) != port.rank:
        raise ValueError(f"port '{port}' has rank {port.rank}, not the {len(shape)} of {shape}")
    name = port.of(layer) if layer is not None else str(port)
    p = ops.parameter(shape, port.dtype, name=name)
    p.output(0).set_names({name})
    return p


def result(value: Output, port: Port, layer: int | None = None) -> ov.Node:
    """The model output `port` (of `layer`, for a per-layer port)."""
    name = port.of(layer) if layer is not None else str(port)
    r = ops.result(value)
    r.set_friendly_name(name)
    r.output(0).set_names({name})
    return r


def argmax(x: Output, path: str) -> Output:
    """Index of the largest value of each row, the first one on ties (as numpy): x [R, V] -> [R] i64.

    Four single-pass kernels instead of TopK(k=1): inside the demo draft's graph TopK took 0.54 of a 1.55 ms call
    (1.00 ms without it), and a stable TopK (numpy's tie rule) costs 93 ms on [8, 151936] (bench_topk.py,
    docs/speed.md).
    """
    top = ops.reduce_max(x, i64([-1]), True)  # [R, 1]
    vocab = ops.gather(ops.shape_of(x, ov.Type.i64), i64(-1), i64(0))  # []
    columns = ops.range(i64(0), vocab, i64(1), ov.Type.i64)  # [V]
    index = ops.select(ops.equal(x, top), columns, vocab)  # [R, V]: own column where the max is, V elsewhere
    first = ops.reduce_min(index, i64([-1]), False)  # [R]
    # A row of -inf (or NaN) matches nowhere, as the CPU's ReduceMax starts from the lowest finite value: index 0
    # then, like numpy for -inf, instead of V, which is no token.
    return named(ops.floor_mod(first, vocab), path)

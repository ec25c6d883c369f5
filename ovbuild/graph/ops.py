"""Small helpers over openvino.opset16: constants, parameters, path-like friendly names."""

from __future__ import annotations

import numpy as np
import openvino as ov
import openvino.opset16 as ops

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


def parameter(name: str, shape: list[int], dtype: ov.Type) -> ov.Node:
    """A model input whose tensor name equals its friendly name, so ports are found by name."""
    p = ops.parameter(shape, dtype, name=name)
    p.output(0).set_names({name})
    return p


def result(value: Output, name: str) -> ov.Node:
    """A model output named `name`."""
    r = ops.result(value)
    r.set_friendly_name(name)
    r.output(0).set_names({name})
    return r

"""Rotary position embedding computed from `position_ids` (no cos/sin table Gather), neox (rotate_half) style."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import openvino as ov
import openvino.opset16 as ops

from ovbuild.graph.ops import Output, const, i64, named
from ovbuild.weights.mrope import MropeSpec
from ovbuild.weights.rope import RopeConfig


@dataclass(frozen=True)
class RotaryTables:
    """cos and sin of every packed row, [T, 1, head_dim], computed once and shared by all layers."""

    cos: Output
    sin: Output


def rotary_tables(position_ids: Output, rope: RopeConfig, head_dim: int) -> RotaryTables:
    """position_ids [T] i64 -> cos/sin [T, 1, head_dim] (scaled by yarn's attention factor where set)."""
    inv_freq = rope.inv_freq(head_dim).astype(np.float32)[None]  # [1, D/2]
    positions = ops.unsqueeze(ops.convert(position_ids, ov.Type.f32), i64([1]))  # [T, 1]
    return _tables(ops.multiply(positions, ops.constant(inv_freq)).output(0), rope)


def mrope_tables(
    position_ids: Output, offsets: Output, rope: RopeConfig, head_dim: int, mrope: MropeSpec
) -> RotaryTables:
    """Multi-axis RoPE: position_ids [T] i64 + offsets [T, 3] i64 (temporal, height, width) -> cos/sin [T, 1, D],
    frequency i turning by the position of its axis. Equal axes give rotary_tables' values bit for bit: each angle
    is the same f32 position times the same f32 frequency."""
    inv_freq = rope.inv_freq(head_dim).astype(np.float32)[None]  # [1, D/2]
    positions = named(ops.add(ops.unsqueeze(position_ids, i64([1])), offsets), "rope/mrope_positions")  # [T, 3]
    per_frequency = ops.gather(positions, i64(mrope.axes()), i64(1))  # [T, D/2]: each frequency's axis position
    angles = ops.multiply(ops.convert(per_frequency, ov.Type.f32), ops.constant(inv_freq))  # [T, D/2]
    return _tables(angles.output(0), rope)


def _tables(angles: Output, rope: RopeConfig) -> RotaryTables:
    """angles [T, D/2] -> cos/sin [T, 1, D] (both halves of each head turn alike, neox style)."""
    angles = ops.unsqueeze(ops.concat([angles, angles], -1), i64([1]))  # [T, 1, D]
    cos, sin = ops.cos(angles), ops.sin(angles)
    if rope.attention_scaling != 1.0:
        cos, sin = ops.multiply(cos, const(rope.attention_scaling)), ops.multiply(sin, const(rope.attention_scaling))
    return RotaryTables(named(cos, "rope/cos"), named(sin, "rope/sin"))


def apply_rope(x: Output, tables: RotaryTables, path: str) -> Output:
    """x [T, heads, D] -> x * cos + rotate_half(x) * sin, rotate_half([a, b]) = [-b, a]."""
    first, second = ops.split(x, i64(-1), 2).outputs()  # 2 x [T, heads, D/2]
    rotated = ops.concat([ops.negative(second), first], -1)  # [T, heads, D]
    return named(ops.add(ops.multiply(x, tables.cos), ops.multiply(rotated, tables.sin)), path)


def apply_partial_rope(x: Output, tables: RotaryTables, rotary_dim: int, path: str) -> Output:
    """RoPE on the first rotary_dim dims of each head, the rest passed through: x [T, heads, D] -> [T, heads, D]."""
    head_dim = x.get_partial_shape()[-1].get_length()
    if rotary_dim == head_dim:
        return apply_rope(x, tables, path)
    turned, kept = ops.variadic_split(x, i64(-1), i64([rotary_dim, head_dim - rotary_dim])).outputs()
    return named(ops.concat([apply_rope(turned, tables, f"{path}/turned"), kept], -1), path)

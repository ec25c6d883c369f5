"""The full-attention sublayer of a hybrid Qwen3.5-family target: Qwen3 attention plus an output gate, partial RoPE
and RMSNorms that scale by (1 + weight).

u ─ q_proj ─ [query | gate] per head ─ q_norm ─ partial rope ─┐
  ─ k_proj ─ k_norm ─ partial rope ─ v_proj ─────────── PagedAttention ─ * sigmoid(gate) ─ o_proj
"""

from __future__ import annotations

import numpy as np
import openvino.opset16 as ops

from ovbuild.graph.context import BuildContext, path
from ovbuild.graph.norm import rms_norm
from ovbuild.graph.ops import Output, i64, named
from ovbuild.graph.rope import apply_partial_rope


def zero_centered_norm(ctx: BuildContext, x: Output, name: str, size: int) -> Output:
    """RMSNorm whose checkpoint weight w is stored around 0 and scales by (1 + w); x [..., size]."""
    w = ctx.weights.get(name, (size,)).to_f32()
    weight = named(ops.constant(np.ascontiguousarray(1.0 + w, np.float32)), f"{path(name)}/one_plus_weight")
    return rms_norm(x, weight, ctx.cfg.rms_norm_eps, path(name))


def gated_attention(ctx: BuildContext, i: int, u: Output) -> Output:
    """Gated attention of layer i on packed rows u [T, H] -> [T, H]."""
    cfg, p = ctx.cfg, f"layers.{i}.self_attn"
    d, heads, kv_heads = cfg.head_dim, cfg.num_heads, cfg.num_kv_heads
    names = [(f"{p}.q_proj", 2 * heads * d), (f"{p}.k_proj", kv_heads * d), (f"{p}.v_proj", kv_heads * d)]
    both, k, v = ctx.linears(u, names, cfg.hidden_size, f"layers.{i}/self_attn/qkv_proj")
    both = ops.reshape(both, i64([0, heads, 2 * d]), True)  # [T, heads, 2 * D]: each head's query, then its gate
    q, gate = ops.split(both, i64(-1), 2).outputs()  # [T, heads, D] each
    q = apply_partial_rope(zero_centered_norm(ctx, q, f"{p}.q_norm", d), ctx.rope, cfg.rotary_dim, f"layers.{i}/q")
    k = ops.reshape(k, i64([0, kv_heads, d]), True)  # [T, kv_heads, D]
    k = apply_partial_rope(zero_centered_norm(ctx, k, f"{p}.k_norm", d), ctx.rope, cfg.rotary_dim, f"layers.{i}/k")
    attn = ctx.attention.attend(
        ops.reshape(q, i64([0, heads * d]), True).output(0),  # [T, heads * D]
        ops.reshape(k, i64([0, kv_heads * d]), True).output(0),  # [T, kv_heads * D]
        v,
        i,
        num_kv_heads=kv_heads,
        head_dim=d,
        path=f"layers.{i}/self_attn/attention",
    )
    gate = ops.sigmoid(ops.reshape(gate, i64([0, heads * d]), True))  # [T, heads * D]
    gated = named(ops.multiply(attn, gate), f"layers.{i}/self_attn/output_gate")
    return ctx.linear(gated, f"{p}.o_proj", cfg.hidden_size, heads * d)

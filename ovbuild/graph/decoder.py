"""Qwen3 decoder-layer pieces shared by the target and every draft: attention sublayer, SwiGLU MLP, embedding.

x ─ input_layernorm ─ u ─┬─ q_proj ─ q_norm ─ rope ──────────┐
             kv_input(u) ┴─ k_proj ─ k_norm ─ rope ─ v_proj ─ PagedAttention ─ o_proj ─ (+x)
  ─ post_attention_layernorm ─ gate/up ─ silu * ─ down ─ (+)
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import openvino.opset16 as ops

from ovbuild.graph.context import BuildContext
from ovbuild.graph.norm import rms_norm
from ovbuild.graph.ops import Output, argmax, i64, named
from ovbuild.graph.rope import RotaryTables, apply_rope


def heads(ctx: BuildContext, x: Output, n: int, norm: str, path: str, rope: RotaryTables | None = None) -> Output:
    """[T, n * D] -> per-head RMSNorm -> RoPE (the rows' tables, default all rows') -> [T, n * D]."""
    d = ctx.cfg.head_dim
    x = ops.reshape(x, i64([0, n, d]), True)  # [T, n, D]
    x = rms_norm(x, ctx.vector(norm, d), ctx.cfg.rms_norm_eps, f"{path}/norm")
    x = apply_rope(x, rope or ctx.rope, f"{path}/rope")
    return ops.reshape(x, i64([0, n * d]), True).output(0)  # [T, n * D]


def self_attention(
    ctx: BuildContext,
    i: int,
    u: Output,
    kv_input: Output | None = None,
    token_type_ids: Output | None = None,
) -> Output:
    """Queries from u [Tq, H], keys/values from kv_input [T, H] (None: u itself, as in the target) -> [Tq, H].

    Projections of one input run as one MatMul (q, k and v of u; or k and v of kv_input). Tq < T when
    ctx.query_rows says which rows of the packed axis u holds: their queries go to those rows of the attention's
    [T, H * D] query input (zeros elsewhere) and only those rows of its output are read.
    """
    cfg, p = ctx.cfg, f"layers.{i}.self_attn"
    h = cfg.hidden_size
    kv_names = [(f"{p}.k_proj", cfg.kv_size), (f"{p}.v_proj", cfg.kv_size)]
    if kv_input is None:
        kv_input = u
        q_proj, k_proj, v = ctx.linears(
            u, [(f"{p}.q_proj", cfg.q_size), *kv_names], h, f"layers.{i}/self_attn/qkv_proj"
        )
    else:
        q_proj = ctx.linear(u, f"{p}.q_proj", cfg.q_size, h)
        k_proj, v = ctx.linears(kv_input, kv_names, h, f"layers.{i}/self_attn/kv_proj")
    q = heads(ctx, q_proj, cfg.num_heads, f"{p}.q_norm", f"layers.{i}/q", ctx.query_rope)  # [Tq, H * D]
    if ctx.query_rows is not None:
        q = named(scatter_rows(q, ctx.query_rows, kv_input), f"layers.{i}/q/rows")  # [T, H * D]
    k = heads(ctx, k_proj, cfg.num_kv_heads, f"{p}.k_norm", f"layers.{i}/k")
    attn = ctx.attention.attend(
        q,
        k,
        v,
        i,
        num_kv_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        sliding_window=cfg.sliding_windows[i],
        token_type_ids=token_type_ids,
        path=f"layers.{i}/self_attn/attention",
    )
    if ctx.query_rows is not None:
        attn = named(ops.gather(attn, ctx.query_rows, i64(0)), f"layers.{i}/self_attn/query_rows")  # [Tq, H * D]
    return ctx.linear(attn, f"{p}.o_proj", h, cfg.q_size)


def scatter_rows(values: Output, rows: Output, like: Output) -> Output:
    """values [Tq, F] written at `rows` [Tq] of a zero [T, F], T being the row count of `like` [T, ...]."""
    shape = ops.concat(
        [ops.gather(ops.shape_of(like), i64([0]), i64(0)), ops.gather(ops.shape_of(values), i64([1]), i64(0))], 0
    )  # [2]: T, F
    zeros = ops.broadcast(ops.constant(np.float32(0)), shape)  # [T, F]
    return ops.scatter_update(zeros, rows, values, i64(0)).output(0)


def mlp(ctx: BuildContext, i: int, x: Output) -> Output:
    """SwiGLU: down(silu(gate x) * up x); x [T, H] -> [T, H]."""
    cfg, p = ctx.cfg, f"layers.{i}.mlp"
    names = [(f"{p}.gate_proj", cfg.intermediate_size), (f"{p}.up_proj", cfg.intermediate_size)]
    gate, up = ctx.linears(x, names, cfg.hidden_size, f"layers.{i}/mlp/gate_up_proj")  # [T, I] each
    hidden = named(ops.multiply(ops.swish(gate), up), f"layers.{i}/mlp/act")
    return ctx.linear(hidden, f"{p}.down_proj", cfg.hidden_size, cfg.intermediate_size)


def norm(ctx: BuildContext, x: Output, name: str) -> Output:
    """RMSNorm with the checkpoint's `name` weight; x [T, H]."""
    return rms_norm(x, ctx.vector(name, ctx.cfg.hidden_size), ctx.cfg.rms_norm_eps, name.replace(".", "/"))


def decoder_layer(
    ctx: BuildContext,
    i: int,
    x: Output,
    kv_input=None,
    token_type_ids: Output | None = None,
) -> Output:
    """One Qwen3 layer on packed rows; kv_input(u) picks each row's key/value source (default: u)."""
    u = norm(ctx, x, f"layers.{i}.input_layernorm")
    attn = self_attention(ctx, i, u, kv_input(u) if kv_input else None, token_type_ids)
    x = named(ops.add(x, attn), f"layers.{i}/attn_residual")
    m = mlp(ctx, i, norm(ctx, x, f"layers.{i}.post_attention_layernorm"))
    return named(ops.add(x, m), f"layers.{i}/output")


def decoder_stack(ctx: BuildContext, x: Output, between: Callable[[int, Output], Output] | None = None) -> list[Output]:
    """Every decoder layer, then the final norm, on rows x [T, H]: each layer's hidden state as transformers reports
    it, so the last layer's is taken after the final norm (a tap of the last layer is what the lm_head reads; the
    reference and GenAI's exporter agree). `between(i, y)` may reroute layer i's output y on its way to layer i + 1.
    """
    n = ctx.cfg.num_layers
    states = []
    for i in range(n):
        x = decoder_layer(ctx, i, x)
        if between is not None and i < n - 1:
            x = between(i, x)
        states.append(x)
    states[-1] = norm(ctx, x, "norm")  # [T, H]
    return states


def embedding(ctx: BuildContext, source, ids: Output, name: str = "embed_tokens") -> Output:
    """Gather rows of the [V, H] table `name` of `source` (a WeightSource): ids [T] -> [T, H]."""
    cfg = ctx.cfg
    table = ctx.matrix(source, name, (cfg.vocab_size, cfg.hidden_size), role="embedding")
    return named(ops.gather(table, ids, i64(0)), f"{name}/gather")


def lm_head(ctx: BuildContext, source, h: Output, name: str = "lm_head") -> Output:
    """h [R, H] @ lm_head^T -> logits [R, V]."""
    cfg = ctx.cfg
    w = ctx.matrix(source, name, (cfg.vocab_size, cfg.hidden_size), role="lm_head")
    return named(ops.matmul(h, w, False, True), name)


def greedy_ids(logits: Output, path: str = "logits/argmax") -> Output:
    """Argmax over the vocabulary inside the graph: logits [R, V] -> [R] i64, so the host never scans logits."""
    return argmax(logits, path)

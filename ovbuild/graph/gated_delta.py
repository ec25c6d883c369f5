"""The linear-attention (Gated DeltaNet) sublayer of a hybrid target on packed rows, with per-sequence states.

Packed rows are laid out as a [S, L] grid (sequence, step; L = the longest sequence of the call; graph/step_grid.py)
for the causal conv and the recurrence, which runs in chunks of rows with all sequences side by side
(graph/gated_delta_chunked.py); outputs go back to the packed rows. The states after the rows named by `state_rows`
leave the graph for the runtime to keep. `delta_rule_loop`, one Loop iteration per step, is the baseline that
bench_hybrid.py, docs/speed.md measures the chunked form against.

u ─ in_proj_qkv ─ causal conv (+ conv state) ─ silu ─ q, k (l2-normalized), v ─┐
  ─ in_proj_b ─ sigmoid = beta; in_proj_a ─ g = -exp(A_log) softplus(a + dt_bias) ─ delta rule (+ state) ─ o
  ─ in_proj_z ─ z;   RMSNorm(o) * norm.weight * silu(z) ─ out_proj
"""

from __future__ import annotations

import numpy as np
import openvino as ov
import openvino.opset16 as ops
from openvino._pyopenvino.op import loop as Loop

from ovbuild.graph.context import BuildContext
from ovbuild.graph.gated_delta_chunked import delta_rule_chunked
from ovbuild.graph.norm import rms_norm
from ovbuild.graph.ops import Output, const, first_output, i64, named
from ovbuild.graph.step_grid import StepGrid


def gated_delta_net(
    ctx: BuildContext, i: int, u: Output, grid: StepGrid, conv_state: Output, recurrent_state: Output
) -> tuple[Output, Output, Output]:
    """Layer i on u [T, H] with each sequence's states before the call (conv [S, C, K-1], recurrent [S, Hv, Dk, Dv]).

    Returns the sublayer output [T, H] and the conv and recurrent states after each state row ([Q, ...]).
    """
    cfg, p, at = ctx.cfg, f"layers.{i}.linear_attn", f"layers.{i}/linear_attn"
    nk, nv, dk, dv = (
        cfg.linear_num_key_heads,
        cfg.linear_num_value_heads,
        cfg.linear_key_head_dim,
        cfg.linear_value_head_dim,
    )
    names = [
        (f"{p}.in_proj_qkv", cfg.conv_dim),
        (f"{p}.in_proj_z", nv * dv),
        (f"{p}.in_proj_b", nv),
        (f"{p}.in_proj_a", nv),
    ]
    mixed, z, b, a = ctx.linears(u, names, cfg.hidden_size, f"{at}/in_proj")
    window = ops.concat([ops.transpose(conv_state, i64([0, 2, 1])), ops.gather(mixed, grid.cells, i64(0))], 1)
    window = named(window, f"{at}/conv/window")  # [S, K-1 + L, C]: each sequence's past inputs, then its new rows
    conv = ops.swish(causal_conv(ctx, window, grid.steps, f"{p}.conv1d", f"{at}/conv"))  # [S, L, C]
    q, k, v = ops.variadic_split(conv, i64(-1), i64([cfg.key_dim, cfg.key_dim, cfg.value_dim])).outputs()
    # each key head serves nv / nk consecutive value heads
    key_head = i64(np.arange(nv) // (nv // nk))
    q = ops.gather(l2_normalize(ops.reshape(q, i64([0, 0, nk, dk]), True)), key_head, i64(2))  # [S, L, Hv, Dk]
    q = ops.multiply(q, const(1.0 / np.sqrt(dk)))
    k = ops.gather(l2_normalize(ops.reshape(k, i64([0, 0, nk, dk]), True)), key_head, i64(2))  # [S, L, Hv, Dk]
    v = ops.reshape(v, i64([0, 0, nv, dv]), True)  # [S, L, Hv, Dv]
    beta = ops.gather(ops.sigmoid(b), grid.cells, i64(0))  # [S, L, Hv]
    rate = np.exp(ctx.weights.get(f"{p}.A_log", (nv,)).to_f32())
    dt_bias = ctx.weights.get(f"{p}.dt_bias", (nv,)).to_f32()
    g = ops.multiply(ops.softplus(ops.add(a, const(dt_bias))), const(-rate))  # [T, Hv]: log decay of each row
    g = ops.gather(g, grid.cells, i64(0))  # [S, L, Hv]
    out, state_out = delta_rule_chunked(q, k, v, g, beta, recurrent_state, grid, at)  # [T, Hv, Dv], [Q, …]
    norm_w = ctx.weights.get(f"{p}.norm", (dv,)).to_f32()
    normed = rms_norm(out, const(norm_w), cfg.rms_norm_eps, f"{at}/norm")
    gated = ops.multiply(normed, ops.swish(ops.reshape(z, i64([0, nv, dv]), True)))  # [T, Hv, Dv]
    gated = named(ops.reshape(gated, i64([0, nv * dv]), True), f"{at}/gated_norm")  # [T, Hv * Dv]
    conv_out = conv_states_at(window, grid, cfg.linear_conv_kernel_dim, f"{at}/conv_state_out")
    return ctx.linear(gated, f"{p}.out_proj", cfg.hidden_size, nv * dv), conv_out, state_out


def causal_conv(ctx: BuildContext, window: Output, steps: Output, name: str, at: str) -> Output:
    """Depthwise causal conv over the grid: step t reads window steps t .. t + K - 1; window [S, K-1 + L, C]."""
    cfg = ctx.cfg
    kernel = cfg.linear_conv_kernel_dim
    w = ctx.weights.get(name, (cfg.conv_dim, 1, kernel)).to_f32()[:, 0].T  # [K, C]: tap j of every channel
    total = None
    for j in range(kernel):
        taps = ops.slice(window, i64([j]), ops.add(steps, i64([j])), i64([1]), i64([1]))  # [S, L, C]
        term = ops.multiply(taps, const(np.ascontiguousarray(w[j])))
        total = term if total is None else ops.add(total, term)
    return named(total, at)


def conv_states_at(window: Output, grid: StepGrid, kernel: int, path_: str) -> Output:
    """The K-1 newest inputs after each state row: window steps t + 1 .. t + K - 1 -> [Q, C, K-1]."""
    steps = ops.add(ops.unsqueeze(grid.state_step, i64([1])), i64(np.arange(1, kernel)[None]))  # [Q, K-1]
    sequence = ops.broadcast(ops.unsqueeze(grid.state_sequence, i64([1])), ops.shape_of(steps, ov.Type.i64))
    cells = ops.concat([ops.unsqueeze(sequence, i64([2])), ops.unsqueeze(steps, i64([2]))], 2)  # [Q, K-1, 2]
    return named(ops.transpose(ops.gather_nd(window, cells), i64([0, 2, 1])), path_)  # [Q, C, K-1]


def l2_normalize(x: Output, eps: float = 1e-6) -> Output:
    """x / sqrt(sum(x^2, last axis) + eps)."""
    return ops.divide(x, ops.sqrt(ops.add(ops.reduce_sum(ops.multiply(x, x), i64([-1]), True), const(eps))))


def delta_rule_loop(
    q: Output, k: Output, v: Output, g: Output, beta: Output, state: Output, grid: StepGrid, at: str
) -> tuple[Output, Output]:
    """The gated delta rule, one grid step per Loop iteration, all sequences at once (the chunked form's baseline).

    q, k [S, L, Hv, Dk], v [S, L, Hv, Dv], g, beta [S, L, Hv], state [S, Hv, Dk, Dv]. Returns the outputs of the
    packed rows [T, Hv, Dv] and the states after each state row [Q, Hv, Dk, Dv].
    """
    shape = state.get_partial_shape()
    heads, dk, dv = (shape[d].get_length() for d in (1, 2, 3))
    step_q = ops.parameter([-1, 1, heads, dk], ov.Type.f32, name="q")
    step_k = ops.parameter([-1, 1, heads, dk], ov.Type.f32, name="k")
    step_v = ops.parameter([-1, 1, heads, dv], ov.Type.f32, name="v")
    step_g = ops.parameter([-1, 1, heads], ov.Type.f32, name="g")
    step_beta = ops.parameter([-1, 1, heads], ov.Type.f32, name="beta")
    carried = ops.parameter([-1, heads, dk, dv], ov.Type.f32, name="state")
    kept = ops.parameter([-1, heads, dk, dv], ov.Type.f32, name="kept")
    iteration = ops.parameter([], ov.Type.i64, name="iteration")
    kept_sequence = ops.parameter([-1], ov.Type.i64, name="state_sequence")
    kept_step = ops.parameter([-1], ov.Type.i64, name="state_step")

    # [S, 1, Hv, D] -> [S, Hv, 1, D]
    qt, kt, vt = (ops.transpose(x, i64([0, 2, 1, 3])) for x in (step_q, step_k, step_v))
    decay = ops.reshape(ops.exp(step_g), i64([0, heads, 1, 1]), True)  # [S, Hv, 1, 1]
    s = ops.multiply(carried, decay)  # [S, Hv, Dk, Dv]
    recalled = ops.matmul(kt, s, False, False)  # [S, Hv, 1, Dv]: what the decayed state holds for key k
    write = ops.multiply(ops.subtract(vt, recalled), ops.reshape(step_beta, i64([0, heads, 1, 1]), True))
    s = ops.add(s, ops.matmul(kt, write, True, False))  # [S, Hv, Dk, Dv]
    out = ops.transpose(ops.matmul(qt, s, False, False), i64([0, 2, 1, 3]))  # [S, 1, Hv, Dv]
    here = ops.reshape(ops.equal(kept_step, iteration), i64([-1, 1, 1, 1]), False)  # [Q, 1, 1, 1]
    kept_new = ops.select(here, ops.gather(s, kept_sequence, i64(0)), kept)  # [Q, Hv, Dk, Dv]
    go_on = ops.constant(np.bool_(True))
    params = [step_q, step_k, step_v, step_g, step_beta, carried, kept, iteration, kept_sequence, kept_step]
    results = [ops.result(go_on), ops.result(s), ops.result(kept_new), ops.result(out)]
    body = ov.Model(results, params, f"{at}/delta_rule_step")

    trips = ops.squeeze(grid.steps, i64([0]))
    node = Loop(trips.output(0), ops.constant(np.bool_(True)).output(0))
    node.set_function(body)
    node.set_special_body_ports([params.index(iteration), 0])
    for param, value in zip(params[:5], (q, k, v, g, beta), strict=True):
        node.set_sliced_input(param, first_output(value), 0, 1, 1, -1, 1)
    node.set_merged_input(carried, first_output(state), results[1].output(0))
    zeros = ops.broadcast(
        const(0.0),
        ops.concat([ops.shape_of(grid.state_sequence, ov.Type.i64), i64([heads, dk, dv])], 0),
    )  # [Q, Hv, Dk, Dv]
    node.set_merged_input(kept, zeros.output(0), results[2].output(0))
    node.set_invariant_input(kept_sequence, first_output(grid.state_sequence))
    node.set_invariant_input(kept_step, first_output(grid.state_step))
    outputs = node.get_concatenated_slices(results[3].output(0), 0, 1, 1, -1, 1)  # [S, L, Hv, Dv]
    final_kept = node.get_iter_value(results[2].output(0), -1)
    node.set_friendly_name(f"{at}/delta_rule")
    return ops.gather_nd(outputs, grid.row_cells).output(0), final_kept  # [T, Hv, Dv]

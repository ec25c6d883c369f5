"""The mixture-of-experts MLP of Qwen3.5-family MoE targets on packed rows, in opset ops (formulas: docs/moe.md).

    x ─ router (float) ─ softmax f32 over E ─ TopK k (stable: ties to the lower expert index, as torch.topk)
      ─ renormalise ─ w [T, k]
    out = Σ_k w · down_e(silu(gate_e x) · up_e x)  +  sigmoid(shared_expert_gate · x) · shared_expert(x)

Two ways to run the routed experts (measured in docs/moe.md, `bench/bench_cost_model.py --moe-designs`):

- "dense": every expert on every row as two compressed FullyConnected calls over all experts, the routing weights
  (zero for experts not chosen) applied between them: gate_up [E·2I, H] then down [H, E·I]. Reads every expert's
  weights once per call, in the plugin's fastest kernel.
- "gather": the chosen experts' compressed codes gathered per row and decompressed, then batched MatMuls:
  reads k experts per row, but decompresses them on the fly.

Compression is per expert: gate_up rows are per output channel of one expert; down's groups span one expert's
inputs (group length I, or the policy's group when it divides I). The router and the shared expert's gate stay
float.
"""

from __future__ import annotations

import numpy as np
import openvino as ov
import openvino.opset16 as ops

from ovbuild.graph.context import BuildContext, path
from ovbuild.graph.ops import Output, i64, named
from ovbuild.graph.quantize.decompression import STORAGE_TYPES, compressed_constant, decompressed
from ovbuild.graph.quantize.nibbles import pack_nibbles
from ovbuild.graph.quantize.rtn import Scheme, quantize_groups, quantize_into
from ovbuild.graph.weights import OV_TYPES, stored_constant
from ovbuild.weights.dtypes import f32_to_bf16, to_f32
from ovbuild.weights.moe import MoeSpec, read_experts
from ovbuild.weights.tensor import WeightTensor

MOE_DESIGNS = ("dense", "gather")
# dense: 1.6 to 4x faster than gather on decode of several sequences, verification and prefill calls; gather wins
# only a lone decode row (docs/moe.md)
DEFAULT_DESIGN = "dense"


def moe_mlp(ctx: BuildContext, i: int, x: Output, spec: MoeSpec, design: str = DEFAULT_DESIGN) -> Output:
    """Layer i's MoE MLP on x [T, H] -> [T, H]."""
    p, h = f"layers.{i}.mlp", ctx.cfg.hidden_size
    weights, indices = route(ctx, i, x, spec)
    run = dense_experts if design == "dense" else gathered_experts
    routed = named(run(ctx, i, x, spec, weights, indices), f"layers.{i}/mlp/experts")
    s = spec.shared_intermediate_size
    names = [(f"{p}.shared_expert.gate_proj", s), (f"{p}.shared_expert.up_proj", s)]
    gate, up = ctx.linears(x, names, h, f"layers.{i}/mlp/shared_expert/gate_up_proj")  # [T, S] each
    shared = ctx.linear(ops.multiply(ops.swish(gate), up).output(0), f"{p}.shared_expert.down_proj", h, s)
    gate_w = float_matrix(ctx, f"{p}.shared_expert_gate", (1, h))
    shared_gate = ops.sigmoid(ops.matmul(x, gate_w, False, True))  # [T, 1]
    shared = named(ops.multiply(shared, shared_gate), f"layers.{i}/mlp/shared_expert/gated")
    return named(ops.add(routed, shared), f"layers.{i}/mlp/output")


def float_matrix(ctx: BuildContext, name: str, shape: tuple[int, int]) -> Output:
    """A matrix that stays float whatever the integer format (the router, the shared expert's gate)."""
    return ctx.policy.uncompressed().matrix(ctx.weights.get(name, shape), path(name))


def route(ctx: BuildContext, i: int, x: Output, spec: MoeSpec) -> tuple[Output, Output]:
    """Routing weights [T, k] f32 (summing to 1 per row) and expert indices [T, k] i64, best first."""
    router = float_matrix(ctx, f"layers.{i}.mlp.gate", (spec.num_experts, ctx.cfg.hidden_size))
    logits = named(ops.matmul(x, router, False, True), f"layers.{i}/mlp/router")  # [T, E]
    probs = named(ops.softmax(logits, -1), f"layers.{i}/mlp/router/softmax")
    # stable: equal scores keep their index order, so the lower expert index wins a tie, as torch.topk does
    top = ops.topk(probs, i64(spec.top_k), -1, "max", "value", "i64", stable=True)
    top.set_friendly_name(f"layers.{i}/mlp/router/topk")
    values, indices = top.output(0), top.output(1)
    total = ops.reduce_sum(values, i64([-1]), True)  # [T, 1]
    return named(ops.divide(values, total), f"layers.{i}/mlp/router/weights"), indices


def dense_experts(ctx: BuildContext, i: int, x: Output, spec: MoeSpec, weights: Output, indices: Output) -> Output:
    """Every expert on every row, weighted by the routing weights scattered over E (zeros elsewhere)."""
    e, inter, h = spec.num_experts, spec.expert_intermediate_size, ctx.cfg.hidden_size
    base = f"layers.{i}/mlp/experts"
    gate_up = read_experts(ctx.weights, i, spec, h, "gate_up")  # [E, 2I, H]
    stacked = WeightTensor(gate_up.name, gate_up.dtype, gate_up.array.reshape(e * 2 * inter, h))  # a view
    w1 = expert_matrix(ctx, stacked, f"{base}/gate_up_proj")
    y = named(ops.matmul(x, w1, False, True), f"{base}/gate_up_proj")  # [T, E * 2I]
    y = ops.reshape(y, i64([0, e, 2, inter]), True)  # [T, E, 2, I]: each expert's gate half, then its up half
    gate, up = (ops.squeeze(part, i64([2])) for part in ops.split(y, i64(2), 2).outputs())  # [T, E, I] each
    act = ops.multiply(ops.swish(gate), up)  # [T, E, I]
    shape = ops.shape_of(weights)  # [2]: T, k
    zeros = ops.broadcast(ops.constant(np.float32(0)), ops.concat([ops.gather(shape, i64([0]), i64(0)), i64([e])], 0))
    dense = ops.scatter_elements_update(zeros, indices, weights, i64(1))  # [T, E]
    act = ops.multiply(act, ops.unsqueeze(dense, i64([2])))  # [T, E, I]
    act = ops.reshape(act, i64([0, e * inter]), True)  # [T, E * I]
    w2 = side_by_side(ctx, read_experts(ctx.weights, i, spec, h, "down"), f"{base}/down_proj")  # [H, E * I]
    return named(ops.matmul(act, w2, False, True), f"{base}/down_proj")  # [T, H]


def expert_matrix(ctx: BuildContext, tensor: WeightTensor, node_path: str) -> Output:
    """A matrix whose rows are experts' output channels, through the policy (integer groups along one row)."""
    scheme = expert_scheme(ctx, tensor.shape[1])
    if scheme is None:
        return stored_constant(tensor, node_path, ctx.policy.float_dtype(tensor))
    return compressed_constant(tensor, scheme, node_path)


def side_by_side(ctx: BuildContext, down: WeightTensor, node_path: str) -> Output:
    """down [E, H, I] as one [H, E * I] matrix, experts side by side along its inputs, built one expert at a time
    into the output buffers (no transposed copy of the checkpoint tensor), integer groups inside one expert."""
    e, h, inter = down.shape
    scheme = expert_scheme(ctx, inter)
    if scheme is None:
        dtype = ctx.policy.float_dtype(down)
        t = ov.Tensor(OV_TYPES[dtype], [h, e * inter])
        dest = (t.data.view(np.uint16) if dtype == "bf16" else t.data).reshape(h, e, inter)  # [H, E, I]
        for x in range(e):
            values = to_f32(down.array[x], down.dtype)
            if dtype == "f16":  # saturating, as stored_constant converts
                values = np.clip(values, -float(np.finfo(np.float16).max), float(np.finfo(np.float16).max))
            dest[:, x] = f32_to_bf16(values) if dtype == "bf16" else values
        c = ov.op.Constant(t)
        return named(c if dtype == "f32" else ops.convert(c, ov.Type.f32), f"{node_path}/weight")
    g = scheme.group_length(inter, down.name)
    groups = inter // g  # per expert and output channel
    codes = ov.Tensor(STORAGE_TYPES[scheme.storage], [h, e * groups, g])  # grouped: a group never spans experts
    scale = ov.Tensor(ov.Type.f16, [h, e * groups, 1])
    zero = None if scheme.sym else np.empty((h, e, groups), np.uint8)  # unpacked; packed once at the end
    row_bytes = inter if scheme.bits == 8 else inter // 2  # one expert's codes in one output row
    code_rows = codes.data.reshape(h, e, -1) if scheme.bits == 8 else codes.data.reshape(h, e * row_bytes)
    for x in range(e):
        w = to_f32(down.array[x], down.dtype).reshape(h, groups, g)  # [H, I/G, G]
        q, s, z = quantize_groups(w, scheme)
        if scheme.bits == 8:
            code_rows[:, x] = q.reshape(h, inter)
        else:  # I even: each row's nibbles of this expert fill whole bytes
            code_rows[:, x * row_bytes : (x + 1) * row_bytes] = pack_nibbles(q).reshape(h, row_bytes)
        scale.data.reshape(h, e, groups)[:, x] = s
        if zero is not None:
            zero[:, x] = z
    zero_point = None
    if zero is not None:
        zero_point = ov.Tensor(STORAGE_TYPES[f"u{scheme.bits}"], [h, e * groups, 1])
        zero_point.data.reshape(-1)[...] = zero.ravel() if scheme.bits == 8 else pack_nibbles(zero)
    return decompressed(codes, scale, zero_point, (h, e * inter), node_path)


def expert_scheme(ctx: BuildContext, expert_inputs: int) -> Scheme | None:
    """The policy's scheme for expert matrices, its group fitted inside one expert's `expert_inputs` inputs."""
    scheme = ctx.policy.scheme("linear")
    if scheme is None:
        return None
    group = scheme.group_size
    if group == -1 or expert_inputs % group:
        group = expert_inputs  # per output channel of one expert
    return Scheme(scheme.bits, scheme.sym, group)


def gathered_experts(ctx: BuildContext, i: int, x: Output, spec: MoeSpec, weights: Output, indices: Output) -> Output:
    """The k chosen experts of each row, their weights gathered (compressed) and decompressed per row."""
    k, inter, h = spec.top_k, spec.expert_intermediate_size, ctx.cfg.hidden_size
    base = f"layers.{i}/mlp/experts"
    flat = ops.reshape(indices, i64([-1]), False)  # [T * k]
    repeated = ops.broadcast(ops.unsqueeze(x, i64([1])), i64([1, k, 1]), broadcast_spec="BIDIRECTIONAL")  # [T, k, H]
    rows = ops.reshape(repeated, i64([-1, 1, h]), False)  # [T * k, 1, H]
    gate_up = read_experts(ctx.weights, i, spec, h, "gate_up")
    w1 = gathered_matrix(ctx, gate_up, flat, f"{base}/gate_up_proj")  # [T * k, 2I, H]
    y = ops.reshape(ops.matmul(rows, w1, False, True), i64([-1, 2, inter]), False)  # [T * k, 2, I]
    gate, up = (ops.squeeze(part, i64([1])) for part in ops.split(y, i64(1), 2).outputs())  # [T * k, I] each
    act = ops.unsqueeze(ops.multiply(ops.swish(gate), up), i64([1]))  # [T * k, 1, I]
    w2 = gathered_matrix(ctx, read_experts(ctx.weights, i, spec, h, "down"), flat, f"{base}/down_proj")  # [T * k, H, I]
    out = ops.reshape(ops.matmul(act, w2, False, True), i64([-1, k, h]), False)  # [T, k, H]
    out = ops.multiply(out, ops.unsqueeze(weights, i64([2])))
    return ops.reduce_sum(out, i64([1]), False).output(0)  # [T, H]


def gathered_matrix(ctx: BuildContext, tensor: WeightTensor, flat: Output, node_path: str) -> Output:
    """Rows `flat` [R] of a stacked [E, N, K] expert tensor, decompressed: [R, N, K] f32."""
    e, n, k = tensor.shape
    two_d = WeightTensor(tensor.name, tensor.dtype, tensor.array.reshape(e * n, k))
    scheme = expert_scheme(ctx, k)
    if scheme is None:
        w = stored_constant(two_d, node_path, ctx.policy.float_dtype(two_d))
        return ops.gather(ops.reshape(w, i64([e, n, k]), False), flat, i64(0)).output(0)
    g = scheme.group_length(k, tensor.name)
    codes = ov.Tensor(STORAGE_TYPES[scheme.storage], [e, n, k // g, g])
    scale = ov.Tensor(ov.Type.f16, [e, n, k // g, 1])
    zero = None if scheme.sym else ov.Tensor(STORAGE_TYPES[f"u{scheme.bits}"], [e, n, k // g, 1])
    quantize_into(
        two_d, scheme, codes.data.reshape(-1), scale.data.reshape(-1), None if zero is None else zero.data.reshape(-1)
    )
    w = ops.convert(ops.gather(named(ov.op.Constant(codes), f"{node_path}/weight/codes"), flat, i64(0)), ov.Type.f16)
    if zero is not None:
        w = ops.subtract(w, ops.convert(ops.gather(ov.op.Constant(zero), flat, i64(0)), ov.Type.f16))
    w = ops.multiply(w, ops.gather(ov.op.Constant(scale), flat, i64(0)))  # [R, N, K/G, G]
    w = ops.reshape(w, i64([-1, n, k]), False)  # [R, N, K]
    return named(ops.convert(w, ov.Type.f32), f"{node_path}/weight")

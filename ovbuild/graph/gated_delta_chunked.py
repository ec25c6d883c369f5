"""The gated delta rule a chunk of rows at a time (docs/hybrid.md, "Chunked form"), all sequences batched.

Everything that does not depend on the state entering a chunk is computed for all chunks at once with batched
MatMuls: the decays, the inverse of the chunk's unit lower-triangular system and the products with it. What is left
runs as one opset Loop over the chunks, three MatMuls per chunk. The states after the state rows are found after the
loop when the row is in the first chunk or is its sequence's last row (all of the runtime's); the loop keeps the
others.

Per sequence and value head, in a chunk of c rows with γ_t = Σ_{s≤t} g_s and D_ts = exp(γ_t − γ_s) (s ≤ t, else 0):
  T = (I + diag(β) strict_lower(D ⊙ K Kᵀ))⁻¹,  U = T (β ⊙ V),  W = T (β ⊙ exp(γ) ⊙ K)
  u = U − W S₀,  o = exp(γ) ⊙ Q S₀ + (D ⊙ Q Kᵀ) u,  S after row t = exp(γ_t) S₀ + Σ_s D_ts k_s ⊗ u_s.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import openvino as ov
import openvino.opset16 as ops
from openvino._pyopenvino.op import loop as Loop

from ovbuild.graph.ops import Output, const, first_output, i64, named
from ovbuild.graph.step_grid import StepGrid

CHUNK = 32  # rows per chunk: the fastest of 16, 32, 64 at prefill 1 x 512 (bench/bench_hybrid.py --chunks 16,32,64)


def delta_rule_chunked(
    q: Output,
    k: Output,
    v: Output,
    g: Output,
    beta: Output,
    state: Output,
    grid: StepGrid,
    at: str,
    chunk: int = CHUNK,
) -> tuple[Output, Output]:
    """The gated delta rule in chunks of min(chunk, L) rows; arguments and results as `delta_rule_loop`'s.

    q, k [S, L, Hv, Dk], v [S, L, Hv, Dv], g, beta [S, L, Hv], state [S, Hv, Dk, Dv]. Returns the outputs
    [S, L', Hv, Dv] (L' ≥ L: steps past L are padding) and the states after each state row [Q, Hv, Dk, Dv].
    """
    if chunk < 1 or chunk & (chunk - 1):
        raise ValueError(f"chunk must be a power of two, got {chunk}")
    shape = state.get_partial_shape()
    heads, dk, dv = (shape[d].get_length() for d in (1, 2, 3))
    at = f"{at}/delta_rule"
    # a short call (decode, verification) is one chunk of its own length: no work on padding
    size = ops.minimum(grid.steps, i64([chunk]))  # [1]: c
    count = ops.divide(ops.add(grid.steps, ops.subtract(size, i64(1))), size)  # [1]: N = ceil(L / c)
    pad = ops.subtract(ops.multiply(count, size), grid.steps)  # [1]: N c - L

    # cells past a sequence's end write nothing (β = 0) and do not decay (g = 0): its state stays as it was
    valid = ops.unsqueeze(grid.valid, i64([2]))  # [S, L, 1]
    g = ops.select(valid, g, const(0.0))
    beta = ops.select(valid, beta, const(0.0))

    def chunks(x: Output, width: int | None) -> Output:
        """[S, L, Hv(, D)] -> [N, S, Hv, c(, D)], zero-padded to N c steps."""
        tail = [] if width is None else [width]
        ends = ops.concat([i64([0]), pad, i64([0] * (1 + len(tail)))], 0)
        padded = ops.pad(x, i64([0] * (3 + len(tail))), ends, "constant")  # [S, N c, Hv(, D)]
        split = ops.reshape(padded, ops.concat([i64([0, -1]), size, i64([heads, *tail])], 0), True)
        return ops.transpose(split, i64([1, 0, 3, 2, 4] if tail else [1, 0, 3, 2]))  # [N, S, c, Hv(, D)] -> above

    qc, kc, vc = chunks(q, dk), chunks(k, dk), chunks(v, dv)  # [N, S, Hv, c, D]
    gc, bc = chunks(g, None), chunks(beta, None)  # [N, S, Hv, c]

    causal, strict, rounds = _masks(chunk, size)
    gamma = named(ops.cumsum(gc, i64(-1)), f"{at}/gamma")  # [N, S, Hv, c]: log decay since the chunk's start
    diff = ops.subtract(ops.unsqueeze(gamma, i64([-1])), ops.unsqueeze(gamma, i64([-2])))  # [N, S, Hv, c, c]: t, s
    # γ_t − γ_s > 0 above the diagonal: masked before exp, which would overflow there
    decay = ops.select(causal, ops.exp(ops.select(causal, diff, const(0.0))), const(0.0))
    decay = named(decay, f"{at}/decay")  # [N, S, Hv, c, c]: D
    kk = ops.multiply(ops.matmul(kc, kc, False, True), ops.select(strict, decay, const(0.0)))  # [N, S, Hv, c, c]
    lower = ops.multiply(kk, ops.unsqueeze(bc, i64([-1])))  # [N, S, Hv, c, c]: the system is I + lower
    inverse = named(_unit_lower_inverse(lower, rounds), f"{at}/inverse")  # [N, S, Hv, c, c]: T
    gate = ops.exp(gamma)  # [N, S, Hv, c]
    writes = named(ops.matmul(inverse, ops.multiply(vc, ops.unsqueeze(bc, i64([-1]))), False, False), f"{at}/U")
    scaled_k = ops.multiply(kc, ops.unsqueeze(ops.multiply(bc, gate), i64([-1])))  # [N, S, Hv, c, Dk]
    recall = named(ops.matmul(inverse, scaled_k, False, False), f"{at}/W")  # [N, S, Hv, c, Dk]
    gated_q = ops.multiply(qc, ops.unsqueeze(gate, i64([-1])))  # [N, S, Hv, c, Dk]
    # both read the state entering the chunk: one MatMul against it in the loop
    reads = named(ops.concat([recall, gated_q], 3), f"{at}/reads")  # [N, S, Hv, 2c, Dk]
    qk = named(ops.multiply(ops.matmul(qc, kc, False, True), decay), f"{at}/qk")  # [N, S, Hv, c, c]
    last = ops.subtract(size, i64(1))  # [1]
    to_end = ops.gather(decay, last, i64(3))  # [N, S, Hv, 1, c]: D from each row to the chunk's last
    end_k = ops.multiply(kc, ops.transpose(to_end, i64([0, 1, 2, 4, 3])))  # [N, S, Hv, c, Dk]
    end_gate = ops.gather(gate, last, i64(3))  # [N, S, Hv, 1]

    # State rows: the state after a sequence's last row is its final state (cells past the end change nothing), rows
    # in the first chunk start from the input state: both are found after the loop; the loop keeps only the others
    # (none in the runtime's calls), in a buffer it carries, which costs a copy per chunk.
    rows = _state_rows(grid, size)
    tensors = {
        "writes": (writes, [-1, heads, -1, dv]),
        "reads": (reads, [-1, heads, -1, dk]),
        "qk": (qk, [-1, heads, -1, -1]),
        "end_k": (end_k, [-1, heads, -1, dk]),
        "end_gate": (end_gate, [-1, heads, 1]),
        "decay": (decay, [-1, heads, -1, -1]),
        "k": (kc, [-1, heads, -1, dk]),
        "gate": (gate, [-1, heads, -1]),
    }
    outputs, final, u, held = _chunk_loop(tensors, state, count, rows, at)
    first = ops.gather(rows.sequence, rows.first, i64(0))  # [F]
    picked = [ops.gather(x, i64(0), i64(0)) for x in (gate, decay, kc, u)]  # chunk 0's: [S, Hv, ...]
    from_input = _states_after(state, *picked, first, ops.gather(rows.row, rows.first, i64(0)))  # [F, Hv, Dk, Dv]
    states = ops.gather(ops.concat([final, from_input, held], 0), rows.source, i64(0))  # [Q, Hv, Dk, Dv]
    outputs = ops.transpose(outputs, i64([1, 0, 3, 2, 4]))  # [S, N, c, Hv, Dv]
    outputs = ops.reshape(outputs, i64([0, -1, heads, dv]), True)  # [S, N c, Hv, Dv]
    return named(outputs, f"{at}/outputs"), named(states, f"{at}/states")


@dataclass(frozen=True)
class _StateRows:
    """The state rows of a call by how their states are found: at their sequence's last row (from the final state),
    in the first chunk (F: from the input state), the others (H: kept by the loop)."""

    sequence: Output  # [Q] i64
    chunk: Output  # [Q] i64
    row: Output  # [Q] i64: the row within its chunk
    first: Output  # [F] i64: indices into the Q state rows
    held: Output  # [H] i64
    source: Output  # [Q] i64: each state row's place in [final states (S) ; first (F) ; held (H)]


def _state_rows(grid: StepGrid, size: Output) -> _StateRows:
    c = ops.squeeze(size, i64([0]))  # []
    chunk = ops.divide(grid.state_step, c)  # [Q]
    lengths = ops.reduce_sum(ops.convert(grid.valid, ov.Type.i64), i64([1]), False)  # [S]
    ends = ops.equal(grid.state_step, ops.gather(ops.subtract(lengths, i64(1)), grid.state_sequence, i64(0)))
    in_first = ops.equal(chunk, i64(0))  # [Q]
    inside = ops.logical_not(ends)

    def where(mask: Output) -> Output:
        return ops.reshape(ops.non_zero(mask), i64([-1]), False).output(0)  # [M]

    def count(x: Output) -> Output:
        return ops.gather(ops.shape_of(x, ov.Type.i64), i64(0), i64(0))  # []

    last, first = where(ends), where(ops.logical_and(in_first, inside))
    held = where(ops.logical_and(ops.logical_not(in_first), inside))
    sequences = count(grid.valid)  # []: S
    after_first = ops.add(sequences, count(first))  # []: S + F
    places = [
        ops.gather(grid.state_sequence, last, i64(0)),
        ops.range(sequences, after_first, i64(1), ov.Type.i64),
        ops.range(after_first, ops.add(after_first, count(held)), i64(1), ov.Type.i64),
    ]
    zeros = ops.broadcast(i64(0), ops.shape_of(grid.state_step, ov.Type.i64))  # [Q]
    source = ops.scatter_update(zeros, ops.concat([last, first, held], 0), ops.concat(places, 0), i64(0))
    row = ops.floor_mod(grid.state_step, c)
    return _StateRows(grid.state_sequence, chunk.output(0), row.output(0), first, held, source.output(0))


def _chunk_loop(
    tensors: dict[str, tuple[Output, list[int]]], state: Output, count: Output, rows: _StateRows, at: str
) -> tuple[Output, Output, Output, Output]:
    """One Loop iteration per chunk over the per-chunk tensors [N, S, Hv, ...]: the outputs [N, S, Hv, c, Dv], the
    final state [S, Hv, Dk, Dv], the writes u [N, S, Hv, c, Dv] and the states after the held rows [H, Hv, Dk, Dv]."""
    shape = state.get_partial_shape()
    heads, dk, dv = (shape[d].get_length() for d in (1, 2, 3))
    body_in = {name: ops.parameter([1, *dims], ov.Type.f32, name=name) for name, (_, dims) in tensors.items()}
    x = {name: ops.squeeze(p, i64([0])) for name, p in body_in.items()}  # one chunk: [S, Hv, ...]
    carried = ops.parameter([-1, heads, dk, dv], ov.Type.f32, name="state")
    held = ops.parameter([-1, heads, dk, dv], ov.Type.f32, name="held")
    iteration = ops.parameter([], ov.Type.i64, name="iteration")
    held_sequence = ops.parameter([-1], ov.Type.i64, name="held_sequence")
    held_chunk = ops.parameter([-1], ov.Type.i64, name="held_chunk")
    held_row = ops.parameter([-1], ov.Type.i64, name="held_row")

    recalled, read = ops.split(ops.matmul(x["reads"], carried, False, False), i64(2), 2).outputs()  # [S, Hv, c, Dv]
    u = ops.subtract(x["writes"], recalled)  # [S, Hv, c, Dv]
    out = ops.add(read, ops.matmul(x["qk"], u, False, False))  # [S, Hv, c, Dv]
    end = ops.multiply(carried, ops.unsqueeze(x["end_gate"], i64([-1])))  # [S, Hv, Dk, Dv]
    end = ops.add(end, ops.matmul(x["end_k"], u, True, False))  # [S, Hv, Dk, Dv]
    here = ops.reshape(ops.non_zero(ops.equal(held_chunk, iteration)), i64([-1]), False)  # [M]
    sequence, row = (ops.gather(x, here, i64(0)) for x in (held_sequence, held_row))  # [M]
    states = _states_after(carried, x["gate"], x["decay"], x["k"], u, sequence, row)  # [M, Hv, Dk, Dv]
    held_new = ops.scatter_update(held, here, states, i64(0))  # [H, Hv, Dk, Dv]

    go_on = ops.constant(np.bool_(True))
    params = [*body_in.values(), carried, held, iteration, held_sequence, held_chunk, held_row]
    results = [ops.result(go_on), ops.result(end), ops.result(held_new)]
    results += [ops.result(ops.unsqueeze(y, i64([0]))) for y in (out, u)]  # [1, S, Hv, c, Dv]
    node = Loop(ops.squeeze(count, i64([0])).output(0), ops.constant(np.bool_(True)).output(0))
    node.set_function(ov.Model(results, params, f"{at}/chunk"))
    node.set_special_body_ports([params.index(iteration), 0])
    for name, (value, _) in tensors.items():
        node.set_sliced_input(body_in[name], first_output(value), 0, 1, 1, -1, 0)
    node.set_merged_input(carried, first_output(state), results[1].output(0))
    zeros = ops.broadcast(
        const(0.0), ops.concat([ops.shape_of(rows.held, ov.Type.i64), i64([heads, dk, dv])], 0)
    )  # [H, Hv, Dk, Dv]
    node.set_merged_input(held, zeros.output(0), results[2].output(0))
    for param, index in ((held_sequence, rows.sequence), (held_chunk, rows.chunk), (held_row, rows.row)):
        node.set_invariant_input(param, ops.gather(index, rows.held, i64(0)).output(0))
    node.set_friendly_name(at)
    outputs, u_all = (node.get_concatenated_slices(r.output(0), 0, 1, 1, -1, 0) for r in results[3:])
    final, held_out = (node.get_iter_value(r.output(0), -1) for r in results[1:3])
    return outputs, final, u_all, held_out


def _states_after(
    start: Output, gate: Output, decay: Output, k: Output, u: Output, sequence: Output, row: Output
) -> Output:
    """The states after M rows of one chunk, exp(γ_t) S₀ + Σ_s D_ts k_s ⊗ u_s, from that chunk's tensors for all
    sequences (start [S, Hv, Dk, Dv], gate [S, Hv, c], decay [S, Hv, c, c], k [S, Hv, c, Dk], u [S, Hv, c, Dv]) and
    each row's sequence and row within the chunk ([M]). Returns [M, Hv, Dk, Dv]."""
    cells = ops.concat([ops.unsqueeze(sequence, i64([1])), ops.unsqueeze(row, i64([1]))], 1)  # [M, 2]
    weights = ops.gather_nd(ops.transpose(decay, i64([0, 2, 1, 3])), cells)  # [M, Hv, c]: D_ts of row t
    row_gate = ops.gather_nd(ops.transpose(gate, i64([0, 2, 1])), cells)  # [M, Hv]: exp(γ_t)
    keys = ops.multiply(ops.gather(k, sequence, i64(0)), ops.unsqueeze(weights, i64([-1])))  # [M, Hv, c, Dk]
    states = ops.matmul(keys, ops.gather(u, sequence, i64(0)), True, False)  # [M, Hv, Dk, Dv]
    begin = ops.multiply(ops.gather(start, sequence, i64(0)), ops.unsqueeze(row_gate, i64([2, 3])))
    return ops.add(states, begin).output(0)


def _masks(chunk: int, size: Output) -> tuple[Output, Output, list[Output]]:
    """The [c, c] masks of a chunk of `size` rows: t ≥ s, t > s, and for each doubling round b = 1, 2, 4, … the
    entries in the same 2b-block but a lower b-block than the diagonal."""
    t, s = np.arange(chunk)[:, None], np.arange(chunk)[None, :]

    def cut(mask: np.ndarray) -> Output:
        return ops.slice(ops.constant(mask), i64([0, 0]), ops.concat([size, size], 0), i64([1, 1])).output(0)

    rounds = []
    b = 1
    while b < chunk:
        rounds.append(cut((t // (2 * b) == s // (2 * b)) & (t // b > s // b)))
        b *= 2
    return cut(t >= s), cut(t > s), rounds


def _unit_lower_inverse(lower: Output, rounds: list[Output]) -> Output:
    """(I + lower)⁻¹ for strictly lower triangular `lower` [..., c, c], by doubling the inverted diagonal blocks.

    With T the inverse of the b-block diagonal part of I + lower and E the entries joining b-blocks into 2b-blocks,
    the inverse of the 2b-block diagonal part is T − T E T (exactly: E T E = 0). log2(c) rounds of two MatMuls; no
    power series, which loses f32 precision when the entries of lower are large.
    """
    inverse = None
    for mask in rounds:
        joins = ops.select(mask, lower, const(0.0))  # [..., c, c]: E
        if inverse is None:  # T = I for 1x1 blocks
            inverse = ops.subtract(_eye_like(lower), joins)
        else:
            inverse = ops.subtract(inverse, ops.matmul(ops.matmul(inverse, joins, False, False), inverse, False, False))
    return _eye_like(lower) if inverse is None else inverse


def _eye_like(x: Output) -> Output:
    """The identity [c, c] for x [..., c, c]."""
    size = ops.gather(ops.shape_of(x, ov.Type.i64), i64(-1), i64(0))  # []
    index = ops.range(i64(0), size, i64(1), ov.Type.i64)  # [c]
    eye = ops.equal(ops.unsqueeze(index, i64([1])), ops.unsqueeze(index, i64([0])))  # [c, c]
    return ops.convert(eye, ov.Type.f32).output(0)

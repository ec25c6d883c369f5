"""The gated delta rule a chunk of rows at a time (docs/hybrid.md, "Chunked form"), all sequences batched.

Each sequence's rows are cut into chunks of c; only chunks holding rows are computed (a call packing 5-row
verifications with a 512-row prompt chunk does not pad the verifications to 512 rows). Everything that does not
depend on the state entering a chunk is computed for all chunks at once with batched MatMuls: the decays, the
inverse of the chunk's unit lower-triangular system and the products with it. What is left runs as one opset Loop
over rounds: round j takes chunk j of every sequence that has one (sequences ordered by their number of chunks, so
those are the first A_j), three MatMuls per round. The states after the state rows are found after the loop when the
row is its sequence's last or in its first chunk (all of the runtime's); the loop keeps the others.

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
    layout = _layout(grid, size, count)

    # cells past a sequence's end write nothing (β = 0) and do not decay (g = 0): its state stays as it was
    valid = ops.unsqueeze(grid.valid, i64([2]))  # [S, L, 1]
    g = ops.select(valid, g, const(0.0))
    beta = ops.select(valid, beta, const(0.0))

    def chunks(x: Output, width: int | None) -> Output:
        """[S, L, Hv(, D)] -> [P, Hv, c(, D)]: the chunks of `layout`, zero-padded past step L."""
        tail = [] if width is None else [width]
        ends = ops.concat([i64([0]), pad, i64([0] * (1 + len(tail)))], 0)
        padded = ops.pad(x, i64([0] * (3 + len(tail))), ends, "constant")  # [S, N c, Hv(, D)]
        split = ops.reshape(padded, ops.concat([i64([0, -1]), size, i64([heads, *tail])], 0), True)
        picked = ops.gather_nd(split, layout.cells)  # [P, c, Hv(, D)]
        return ops.transpose(picked, i64([0, 2, 1, 3] if tail else [0, 2, 1]))  # [P, Hv, c(, D)]

    qc, kc, vc = chunks(q, dk), chunks(k, dk), chunks(v, dv)  # [P, Hv, c, D]
    gc, bc = chunks(g, None), chunks(beta, None)  # [P, Hv, c]

    causal, strict, rounds = _masks(chunk, size)
    gamma = named(ops.cumsum(gc, i64(-1)), f"{at}/gamma")  # [P, Hv, c]: log decay since the chunk's start
    diff = ops.subtract(ops.unsqueeze(gamma, i64([-1])), ops.unsqueeze(gamma, i64([-2])))  # [P, Hv, c, c]: t, s
    # γ_t − γ_s > 0 above the diagonal: masked before exp, which would overflow there
    decay = ops.select(causal, ops.exp(ops.select(causal, diff, const(0.0))), const(0.0))
    decay = named(decay, f"{at}/decay")  # [P, Hv, c, c]: D
    kk = ops.multiply(ops.matmul(kc, kc, False, True), ops.select(strict, decay, const(0.0)))  # [P, Hv, c, c]
    lower = ops.multiply(kk, ops.unsqueeze(bc, i64([-1])))  # [P, Hv, c, c]: the system is I + lower
    inverse = named(_unit_lower_inverse(lower, rounds), f"{at}/inverse")  # [P, Hv, c, c]: T
    gate = ops.exp(gamma)  # [P, Hv, c]
    writes = named(ops.matmul(inverse, ops.multiply(vc, ops.unsqueeze(bc, i64([-1]))), False, False), f"{at}/U")
    scaled_k = ops.multiply(kc, ops.unsqueeze(ops.multiply(bc, gate), i64([-1])))  # [P, Hv, c, Dk]
    recall = named(ops.matmul(inverse, scaled_k, False, False), f"{at}/W")  # [P, Hv, c, Dk]
    gated_q = ops.multiply(qc, ops.unsqueeze(gate, i64([-1])))  # [P, Hv, c, Dk]
    qk = named(ops.multiply(ops.matmul(qc, kc, False, True), decay), f"{at}/qk")  # [P, Hv, c, c]
    last = ops.subtract(size, i64(1))  # [1]
    to_end = ops.gather(decay, last, i64(2))  # [P, Hv, 1, c]: D from each row to the chunk's last
    end_k = ops.multiply(kc, ops.transpose(to_end, i64([0, 1, 3, 2])))  # [P, Hv, c, Dk]
    end_gate = ops.gather(gate, last, i64(2))  # [P, Hv, 1]
    # the two read against the state entering the chunk in one MatMul, and end_k: one gather a round for the three
    reads = named(ops.concat([recall, gated_q, end_k], 2), f"{at}/reads")  # [P, Hv, 3c, Dk]

    # State rows: the state after a sequence's last row is its final state (cells past the end change nothing), rows
    # in the first chunk start from the input state: both are found after the loop; the loop keeps only the others
    # (none in the runtime's calls), in a buffer it carries, which costs a copy per round.
    rows = _state_rows(grid, size, layout)
    tensors = {
        "reads": reads,
        "writes": writes,
        "qk": qk,
        "end_gate": end_gate,
        "gate": gate,
        "decay": decay,
        "k": kc,
    }
    ranked = ops.gather(state, layout.order, i64(0)).output(0)  # [S, Hv, Dk, Dv]: in rank order
    outputs, final, u, held = _round_loop(tensors, ranked, count, layout, rows, at)
    # the first round's chunks are the first A_0 of the P, in rank order
    first = ops.gather(rows.rank, rows.first, i64(0))  # [F]
    start = ops.gather(state, ops.gather(grid.state_sequence, rows.first, i64(0)), i64(0))  # [F, Hv, Dk, Dv]
    u0 = ops.gather(u, i64(0), i64(0))  # [S, Hv, c, Dv]
    from_input = _states_after(start, gate, decay, kc, u0, first, ops.gather(rows.row, rows.first, i64(0)))
    states = ops.gather(ops.concat([final, from_input, held], 0), rows.source, i64(0))  # [Q, Hv, Dk, Dv]
    outputs = ops.gather(outputs, layout.rank, i64(1))  # [N, S, Hv, c, Dv]: back in sequence order
    outputs = ops.transpose(outputs, i64([1, 0, 3, 2, 4]))  # [S, N, c, Hv, Dv]
    outputs = ops.reshape(outputs, i64([0, -1, heads, dv]), True)  # [S, N c, Hv, Dv]
    return named(outputs, f"{at}/outputs"), named(states, f"{at}/states")


@dataclass(frozen=True)
class _Layout:
    """Which chunks a call computes: sequences ranked by their number of chunks (most first), round j holds chunk j
    of ranks 0 .. A_j - 1, and the P chunks are listed round after round."""

    order: Output  # [S] i64: the sequence at each rank
    rank: Output  # [S] i64: each sequence's rank
    active: Output  # [N] i64: A_j
    offset: Output  # [N] i64: where round j starts among the P chunks
    cells: Output  # [P, 2] i64: (sequence, chunk) of each


def _layout(grid: StepGrid, size: Output, count: Output) -> _Layout:
    lengths = ops.reduce_sum(ops.convert(grid.valid, ov.Type.i64), i64([1]), False)  # [S]
    chunks = ops.divide(ops.add(lengths, ops.subtract(size, i64(1))), size)  # [S]: ⌈length / c⌉
    sequences = ops.shape_of(lengths, ov.Type.i64)  # [1]: S
    order = ops.topk(chunks, ops.squeeze(sequences, i64([0])), 0, "max", "value", ov.Type.i64).output(1)  # [S]
    ranks = ops.range(i64(0), ops.squeeze(sequences, i64([0])), i64(1), ov.Type.i64)  # [S]
    rank = ops.scatter_update(ops.broadcast(i64(0), sequences), order, ranks, i64(0))  # [S]
    rounds = ops.range(i64(0), ops.squeeze(count, i64([0])), i64(1), ov.Type.i64)  # [N]
    taking = ops.greater(ops.unsqueeze(ops.gather(chunks, order, i64(0)), i64([0])), ops.unsqueeze(rounds, i64([1])))
    active = ops.reduce_sum(ops.convert(taking, ov.Type.i64), i64([1]), False)  # [N]: A_j
    offset = ops.cumsum(active, i64(0), exclusive=True)  # [N]
    # taking is [N, S], true on each row's first A_j ranks: its true cells in row-major order are the P chunks
    where = ops.transpose(ops.non_zero(taking, ov.Type.i64), i64([1, 0]))  # [P, 2]: (round, rank)
    round_, rank_of = (ops.squeeze(x, i64([1])) for x in ops.split(where, i64(1), 2).outputs())  # [P]
    cells = ops.concat(
        [ops.unsqueeze(ops.gather(order, rank_of, i64(0)), i64([1])), ops.unsqueeze(round_, i64([1]))], 1
    )
    return _Layout(*(first_output(x) for x in (order, rank, active, offset, cells)))


@dataclass(frozen=True)
class _StateRows:
    """The state rows of a call by how their states are found: at their sequence's last row (from the final state),
    in the first chunk (F: from the input state), the others (H: kept by the loop)."""

    rank: Output  # [Q] i64: the rank of each state row's sequence
    chunk: Output  # [Q] i64
    row: Output  # [Q] i64: the row within its chunk
    first: Output  # [F] i64: indices into the Q state rows
    held: Output  # [H] i64
    source: Output  # [Q] i64: each state row's place in [final states (S, rank order) ; first (F) ; held (H)]


def _state_rows(grid: StepGrid, size: Output, layout: _Layout) -> _StateRows:
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
    rank = ops.gather(layout.rank, grid.state_sequence, i64(0))  # [Q]
    places = [
        ops.gather(rank, last, i64(0)),
        ops.range(sequences, after_first, i64(1), ov.Type.i64),
        ops.range(after_first, ops.add(after_first, count(held)), i64(1), ov.Type.i64),
    ]
    zeros = ops.broadcast(i64(0), ops.shape_of(grid.state_step, ov.Type.i64))  # [Q]
    source = ops.scatter_update(zeros, ops.concat([last, first, held], 0), ops.concat(places, 0), i64(0))
    row = ops.floor_mod(grid.state_step, c)
    return _StateRows(rank.output(0), chunk.output(0), row.output(0), first, held, source.output(0))


def _round_loop(
    tensors: dict[str, Output], state: Output, count: Output, layout: _Layout, rows: _StateRows, at: str
) -> tuple[Output, Output, Output, Output]:
    """One Loop iteration per round over the chunk tensors [P, Hv, ...] from the states in rank order: the outputs
    [N, S, Hv, c, Dv] and writes u [N, S, Hv, c, Dv] (rank order; zero past A_j), the final states [S, Hv, Dk, Dv]
    (rank order) and the states after the held rows [H, Hv, Dk, Dv]."""
    shape = state.get_partial_shape()
    heads, dk, dv = (shape[d].get_length() for d in (1, 2, 3))
    body_in = {
        name: ops.parameter(first_output(value).get_partial_shape(), ov.Type.f32, name=name)
        for name, value in tensors.items()
    }
    carried = ops.parameter([-1, heads, dk, dv], ov.Type.f32, name="state")
    held = ops.parameter([-1, heads, dk, dv], ov.Type.f32, name="held")
    iteration = ops.parameter([], ov.Type.i64, name="iteration")
    small = {name: ops.parameter([-1], ov.Type.i64, name=name) for name in ("active", "offset", "rank", "chunk", "row")}

    taken = ops.gather(small["active"], ops.unsqueeze(iteration, i64([0])), i64(0))  # [1]: A_j
    begin = ops.gather(small["offset"], ops.unsqueeze(iteration, i64([0])), i64(0))  # [1]
    picked = ops.range(ops.squeeze(begin, i64([0])), ops.squeeze(ops.add(begin, taken), i64([0])), i64(1), ov.Type.i64)
    # round j's chunks, [A_j, Hv, ...]; the held rows' tensors are gathered for those rows only
    x = {name: ops.gather(body_in[name], picked, i64(0)) for name in ("reads", "writes", "qk", "end_gate")}
    size = ops.gather(ops.shape_of(x["qk"], ov.Type.i64), i64([3]), i64(0))  # [1]: c
    reads, end_k = ops.variadic_split(x["reads"], i64(2), ops.concat([ops.multiply(size, i64(2)), size], 0)).outputs()
    now, later = ops.variadic_split(carried, i64(0), ops.concat([taken, i64([-1])], 0)).outputs()  # A_j, S - A_j
    recalled, read = ops.split(ops.matmul(reads, now, False, False), i64(2), 2).outputs()  # [A_j, Hv, c, Dv]
    u = ops.subtract(x["writes"], recalled)  # [A_j, Hv, c, Dv]
    out = ops.add(read, ops.matmul(x["qk"], u, False, False))  # [A_j, Hv, c, Dv]
    end = ops.multiply(now, ops.unsqueeze(x["end_gate"], i64([-1])))  # [A_j, Hv, Dk, Dv]
    end = ops.add(end, ops.matmul(end_k, u, True, False))  # [A_j, Hv, Dk, Dv]
    carried_new = ops.concat([end, later], 0)  # [S, Hv, Dk, Dv]

    here = ops.reshape(ops.non_zero(ops.equal(small["chunk"], iteration)), i64([-1]), False)  # [M]
    rank, row = (ops.gather(small[n], here, i64(0)) for n in ("rank", "row"))  # [M]
    chunk = ops.add(begin, rank)  # [M]: among the P chunks
    start = ops.gather(carried, rank, i64(0))  # [M, Hv, Dk, Dv]
    picks = [ops.gather(body_in[n], chunk, i64(0)) for n in ("gate", "decay", "k")]  # [M, Hv, ...]
    states = _states_after(
        start,
        *picks,
        ops.gather(u, rank, i64(0)),
        ops.range(i64(0), ops.gather(ops.shape_of(here, ov.Type.i64), i64(0), i64(0)), i64(1), ov.Type.i64),
        row,
    )
    held_new = ops.scatter_update(held, here, states, i64(0))  # [H, Hv, Dk, Dv]

    sequences = ops.gather(ops.shape_of(carried, ov.Type.i64), i64([0]), i64(0))  # [1]: S

    def padded(y: Output) -> Output:
        """[A_j, Hv, c, Dv] -> [1, S, Hv, c, Dv], zeros past A_j."""
        rest = ops.concat([ops.subtract(sequences, taken), i64([heads]), size, i64([dv])], 0)  # [4]
        return ops.unsqueeze(ops.concat([y, ops.broadcast(const(0.0), rest)], 0), i64([0]))

    go_on = ops.constant(np.bool_(True))
    params = [*body_in.values(), carried, held, iteration, *small.values()]
    results = [ops.result(go_on), ops.result(carried_new), ops.result(held_new)]
    results += [ops.result(padded(y)) for y in (out, u)]
    node = Loop(ops.squeeze(count, i64([0])).output(0), ops.constant(np.bool_(True)).output(0))
    node.set_function(ov.Model(results, params, f"{at}/round"))
    node.set_special_body_ports([params.index(iteration), 0])
    for name, value in tensors.items():
        node.set_invariant_input(body_in[name], first_output(value))
    node.set_merged_input(carried, first_output(state), results[1].output(0))
    zeros = ops.broadcast(
        const(0.0), ops.concat([ops.shape_of(rows.held, ov.Type.i64), i64([heads, dk, dv])], 0)
    )  # [H, Hv, Dk, Dv]
    node.set_merged_input(held, zeros.output(0), results[2].output(0))
    for name, index in (("active", layout.active), ("offset", layout.offset)):
        node.set_invariant_input(small[name], first_output(index))
    for name, index in (("rank", rows.rank), ("chunk", rows.chunk), ("row", rows.row)):
        node.set_invariant_input(small[name], ops.gather(index, rows.held, i64(0)).output(0))
    node.set_friendly_name(at)
    outputs, u_all = (node.get_concatenated_slices(r.output(0), 0, 1, 1, -1, 0) for r in results[3:])
    final, held_out = (node.get_iter_value(r.output(0), -1) for r in results[1:3])
    return outputs, final, u_all, held_out


def _states_after(
    start: Output, gate: Output, decay: Output, k: Output, u: Output, chunk: Output, row: Output
) -> Output:
    """The states after M rows, exp(γ_t) S₀ + Σ_s D_ts k_s ⊗ u_s, from the states entering their chunks
    (start [M, Hv, Dk, Dv]), chunk tensors (gate [P, Hv, c], decay [P, Hv, c, c], k [P, Hv, c, Dk], u [P, Hv, c, Dv])
    and each row's chunk among those and row within it ([M]). Returns [M, Hv, Dk, Dv]."""
    cells = ops.concat([ops.unsqueeze(chunk, i64([1])), ops.unsqueeze(row, i64([1]))], 1)  # [M, 2]
    weights = ops.gather_nd(ops.transpose(decay, i64([0, 2, 1, 3])), cells)  # [M, Hv, c]: D_ts of row t
    row_gate = ops.gather_nd(ops.transpose(gate, i64([0, 2, 1])), cells)  # [M, Hv]: exp(γ_t)
    keys = ops.multiply(ops.gather(k, chunk, i64(0)), ops.unsqueeze(weights, i64([-1])))  # [M, Hv, c, Dk]
    states = ops.matmul(keys, ops.gather(u, chunk, i64(0)), True, False)  # [M, Hv, Dk, Dv]
    return ops.add(states, ops.multiply(start, ops.unsqueeze(row_gate, i64([2, 3])))).output(0)


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

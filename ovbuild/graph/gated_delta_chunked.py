"""The gated delta rule a chunk of rows at a time (docs/hybrid.md, "Chunked form"), all sequences batched.

Each sequence's rows are cut into chunks of c; only chunks holding rows are computed (a call packing 5-row
verifications with a 512-row prompt chunk does not pad the verifications to 512 rows). Everything that does not
depend on the state entering a chunk is computed for all chunks at once with batched MatMuls: the decays, the
inverse of the chunk's unit lower-triangular system and the products with it. Every sequence's first chunk then
starts from its input state and runs without a loop (decode and verification calls have no other); later chunks run
as one opset Loop over rounds: round j takes chunk j of every sequence that has one, sequences ranked by their
number of chunks so that those are the first A_j. The states after the state rows are found after the loop when the
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

CHUNK = 16  # rows per chunk: a little faster than 8, 32 and 64 at prefill (bench_hybrid.py, docs/speed.md)
# the chunk tensors the rounds read, and those only the state rows read
_ROUND = ("reads", "writes", "qk", "end_gate")
_ROWS = ("gate", "decay", "k")


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

    q, k [S, L, Hv, Dk], v [S, L, Hv, Dv], g, beta [S, L, Hv], state [S, Hv, Dk, Dv]. Returns the outputs of the
    packed rows [T, Hv, Dv] and the states after each state row [Q, Hv, Dk, Dv].
    """
    if chunk < 1 or chunk & (chunk - 1):
        raise ValueError(f"chunk must be a power of two, got {chunk}")
    shape = state.get_partial_shape()
    heads, dk, dv = (shape[d].get_length() for d in (1, 2, 3))
    at = f"{at}/delta_rule"
    # a short call (decode, verification) is one chunk of its own length: no work on padding
    size = ops.minimum(grid.steps, i64([chunk]))  # [1]: c
    count = ops.divide(ops.add(grid.steps, ops.subtract(size, i64(1))), size)  # [1]: N = ceil(L / c)
    layout = _layout(grid, size, count)

    # (sequence, step) of each row of the P chunks; steps past L read step L - 1, and are not real
    steps = ops.add(
        ops.unsqueeze(ops.multiply(ops.gather(layout.cells, i64(1), i64(1)), size), i64([1])),
        ops.unsqueeze(ops.range(i64(0), ops.squeeze(size, i64([0])), i64(1), ov.Type.i64), i64([0])),
    )  # [P, c]
    owners = ops.broadcast(ops.gather(layout.cells, i64([0]), i64(1)), ops.shape_of(steps, ov.Type.i64))  # [P, c]
    # cells past a sequence's end write nothing (β = 0) and do not decay (g = 0): its state stays as it was
    real = ops.unsqueeze(ops.less(steps, ops.gather(layout.lengths, owners, i64(0))), i64([1]))  # [P, 1, c]
    steps = ops.minimum(steps, ops.subtract(grid.steps, i64(1)))
    cells = ops.concat([ops.unsqueeze(owners, i64([2])), ops.unsqueeze(steps, i64([2]))], 2)  # [P, c, 2]

    def chunks(x: Output, width: int | None) -> Output:
        """[S, L, Hv(, D)] -> [P, Hv, c(, D)]: the chunks of `layout`."""
        picked = ops.gather_nd(x, cells)  # [P, c, Hv(, D)]
        return ops.transpose(picked, i64([0, 2, 1, 3] if width else [0, 2, 1]))  # [P, Hv, c(, D)]

    qc, kc, vc = chunks(q, dk), chunks(k, dk), chunks(v, dv)  # [P, Hv, c, D]
    gc, bc = (ops.select(real, chunks(x, None), const(0.0)) for x in (g, beta))  # [P, Hv, c]

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
    # W and exp(γ) ⊙ Q are read against the state entering the chunk in one MatMul; end_k rides along, so that a
    # round gathers one tensor for the three
    reads = named(ops.concat([recall, gated_q, end_k], 2), f"{at}/reads")  # [P, Hv, 3c, Dk]
    tensors = {"reads": reads, "writes": writes, "qk": qk, "end_gate": end_gate, "gate": gate, "decay": decay, "k": kc}
    tensors = {name: first_output(x) for name, x in tensors.items()}

    # every sequence's first chunk (the first S of the P), from the input states
    sequences = ops.gather(ops.shape_of(state, ov.Type.i64), i64([0]), i64(0))  # [1]: S
    firsts = [ops.slice(tensors[name], i64([0]), sequences, i64([1]), i64([0])) for name in _ROUND]
    out0, u0, end0 = _chunk_step(*firsts, state)  # [S, Hv, c, Dv], [S, Hv, c, Dv], [S, Hv, Dk, Dv]
    # later chunks: the sequences that have them, in rank order
    start = ops.gather(end0, layout.later, i64(0)).output(0)  # [M, Hv, Dk, Dv]
    rows = _state_rows(grid, size, layout)
    outputs, final, held = _round_loop(tensors, start, layout, rows, at)  # [R, M, Hv, c, Dv], [M, …], [H, …]

    # State rows: the state after a sequence's last row is its final state (cells past the end change nothing), rows
    # in the first chunk start from the input state: both are found after the loop; the loop keeps only the others
    # (none in the runtime's calls), in a buffer it carries, which costs a copy per round.
    sequence = ops.gather(grid.state_sequence, rows.first, i64(0))  # [F]
    picks = [ops.gather(tensors[name], sequence, i64(0)) for name in _ROWS]  # [F, Hv, ...]: chunk p = sequence
    begin = ops.gather(state, sequence, i64(0))  # [F, Hv, Dk, Dv]
    row = ops.gather(rows.row, rows.first, i64(0))  # [F]
    from_input = _states_after(begin, *picks, ops.gather(u0, sequence, i64(0)), row)  # [F, Hv, Dk, Dv]
    states = ops.gather(ops.concat([end0, final, from_input, held], 0), rows.source, i64(0))  # [Q, Hv, Dk, Dv]

    # outputs: [first chunks ; later rounds] as rows, then each packed row's
    table = [ops.transpose(out0, i64([0, 2, 1, 3])), ops.transpose(outputs, i64([0, 1, 3, 2, 4]))]
    table = ops.concat([ops.reshape(x, i64([-1, heads, dv]), False) for x in table], 0)  # [S c + R M c, Hv, Dv]
    outputs = ops.gather(table, _output_rows(grid, size, layout), i64(0))  # [T, Hv, Dv]
    return named(outputs, f"{at}/outputs"), named(states, f"{at}/states")


@dataclass(frozen=True)
class _Layout:
    """Which P chunks a call computes: first every sequence's first chunk (in sequence order), then round after round
    (round j = 1 .. N - 1) chunk j of the M sequences with more than one chunk, ranked by their number of chunks (most
    first), so that round j takes the first A_j ranks; last a chunk of no rows. The loop runs R = max(N - 1, 1)
    rounds: a call without later chunks runs one round of none."""

    lengths: Output  # [S] i64: rows of each sequence
    rank: Output  # [S] i64: each sequence's rank (those with one chunk after the M others)
    later: Output  # [M] i64: the sequence at each of the first M ranks
    active: Output  # [R] i64: A_j
    offset: Output  # [R] i64: where round j starts among the P chunks
    cells: Output  # [P, 2] i64: (sequence, chunk) of each


def _layout(grid: StepGrid, size: Output, count: Output) -> _Layout:
    lengths = grid.lengths  # [S]
    chunks = ops.divide(ops.add(lengths, ops.subtract(size, i64(1))), size)  # [S]: ⌈length / c⌉
    sequences = ops.shape_of(lengths, ov.Type.i64)  # [1]: S
    order = ops.topk(chunks, ops.squeeze(sequences, i64([0])), 0, "max", "value", ov.Type.i64).output(1)  # [S]
    ranks = ops.range(i64(0), ops.squeeze(sequences, i64([0])), i64(1), ov.Type.i64)  # [S]
    rank = ops.scatter_update(ops.broadcast(i64(0), sequences), order, ranks, i64(0))  # [S]
    multi = ops.reduce_sum(ops.convert(ops.greater(chunks, i64(1)), ov.Type.i64), i64([0]), True)  # [1]: M
    later = ops.slice(order, i64([0]), multi, i64([1]), i64([0]))  # [M]
    # round j = 1 .. N - 1 takes the ranks whose sequences have more than j chunks
    rounds = ops.range(i64(1), ops.squeeze(count, i64([0])), i64(1), ov.Type.i64)  # [N - 1]
    taking = ops.greater(ops.unsqueeze(ops.gather(chunks, later, i64(0)), i64([0])), ops.unsqueeze(rounds, i64([1])))
    active = ops.reduce_sum(ops.convert(taking, ov.Type.i64), i64([1]), False)  # [N - 1]
    offset = ops.add(ops.cumsum(active, i64(0), exclusive=True), sequences)  # [N - 1]
    # taking is [N - 1, M], true on each row's first A_j ranks: its true cells in row-major order are the chunks
    where = ops.transpose(ops.non_zero(taking, ov.Type.i64), i64([1, 0]))  # [P - S - 1, 2]: (round - 1, rank)
    round_, rank_of = (ops.squeeze(x, i64([1])) for x in ops.split(where, i64(1), 2).outputs())  # [P - S - 1]
    first = ops.concat(
        [ops.unsqueeze(ranks, i64([1])), ops.broadcast(i64([[0]]), ops.concat([sequences, i64([1])], 0))], 1
    )
    cells = ops.concat(
        [ops.unsqueeze(ops.gather(later, rank_of, i64(0)), i64([1])), ops.unsqueeze(ops.add(round_, i64(1)), i64([1]))],
        1,
    )  # [P - S - 1, 2]
    # then a chunk of no rows (chunk N of sequence 0 lies past L): β = 0 and g = 0 make it leave a state as it is,
    # which is what a sequence without chunk j gets in round j
    nothing = ops.unsqueeze(ops.concat([i64([0]), count], 0), i64([0]))  # [1, 2]
    cells = ops.concat([first, cells, nothing], 0)  # [P, 2]
    # a call without later chunks runs one round of none (a Loop's stacked outputs need one iteration)
    active = ops.concat([active, i64([0])], 0)
    offset = ops.concat([offset, i64([0])], 0)
    trips = ops.maximum(ops.subtract(count, i64(1)), i64([1]))  # [1]: R
    active, offset = (ops.slice(x, i64([0]), trips, i64([1]), i64([0])) for x in (active, offset))
    return _Layout(*(first_output(x) for x in (lengths, rank, later, active, offset, cells)))


@dataclass(frozen=True)
class _StateRows:
    """The state rows of a call by how their states are found: at their sequence's last row (from the final state),
    in the first chunk (F: from the input state), the others (H: kept by the loop)."""

    rank: Output  # [Q] i64: the rank of each state row's sequence
    chunk: Output  # [Q] i64
    row: Output  # [Q] i64: the row within its chunk
    first: Output  # [F] i64: indices into the Q state rows
    held: Output  # [H] i64
    source: Output  # [Q] i64: each state row's place in [end of first chunks (S) ; final (M) ; first (F) ; held (H)]


def _state_rows(grid: StepGrid, size: Output, layout: _Layout) -> _StateRows:
    c = ops.squeeze(size, i64([0]))  # []
    chunk = ops.divide(grid.state_step, c)  # [Q]
    ends = ops.equal(grid.state_step, ops.gather(ops.subtract(grid.lengths, i64(1)), grid.state_sequence, i64(0)))
    in_first = ops.equal(chunk, i64(0))  # [Q]
    inside = ops.logical_not(ends)

    def where(mask: Output) -> Output:
        return ops.reshape(ops.non_zero(mask), i64([-1]), False).output(0)  # [M]

    last, first = where(ends), where(ops.logical_and(in_first, inside))
    held = where(ops.logical_and(ops.logical_not(in_first), inside))
    rank = ops.gather(layout.rank, grid.state_sequence, i64(0))  # [Q]
    # a last row in the first chunk: the end of that chunk; else the loop's final state, at S + rank
    sequences = _count(grid.lengths)  # []: S
    end_at = ops.select(ops.equal(chunk, i64(0)), grid.state_sequence, ops.add(sequences, rank))  # [Q]
    firsts_at = ops.add(sequences, _count(layout.later))  # []: S + M
    held_at = ops.add(firsts_at, _count(first))  # []: S + M + F
    places = [
        ops.gather(end_at, last, i64(0)),
        ops.range(firsts_at, held_at, i64(1), ov.Type.i64),
        ops.range(held_at, ops.add(held_at, _count(held)), i64(1), ov.Type.i64),
    ]
    zeros = ops.broadcast(i64(0), ops.shape_of(grid.state_step, ov.Type.i64))  # [Q]
    source = ops.scatter_update(zeros, ops.concat([last, first, held], 0), ops.concat(places, 0), i64(0))
    row = ops.floor_mod(grid.state_step, c)
    return _StateRows(rank.output(0), chunk.output(0), row.output(0), first, held, source.output(0))


def _output_rows(grid: StepGrid, size: Output, layout: _Layout) -> Output:
    """Each packed row's place among the rows of [first chunks (S c) ; rounds (R M c)]: [T] i64."""
    sequence, step = (ops.squeeze(x, i64([1])) for x in ops.split(grid.row_cells, i64(1), 2).outputs())  # [T]
    c = ops.squeeze(size, i64([0]))  # []
    chunk, row = ops.divide(step, c), ops.floor_mod(step, c)  # [T]
    sequences, multi = _count(grid.lengths), _count(layout.later)  # []: S, M
    rank = ops.gather(layout.rank, sequence, i64(0))  # [T]
    later = ops.add(
        ops.multiply(sequences, c), ops.multiply(ops.add(ops.multiply(ops.subtract(chunk, i64(1)), multi), rank), c)
    )
    place = ops.select(ops.equal(chunk, i64(0)), ops.multiply(sequence, c), later)  # [T]: the chunk's first row
    return ops.add(place, row).output(0)


def _chunk_step(
    reads: Output, writes: Output, qk: Output, end_gate: Output, state: Output
) -> tuple[Output, Output, Output]:
    """One chunk of each of B sequences from the states entering it (state [B, Hv, Dk, Dv]; reads [B, Hv, 3c, Dk],
    writes [B, Hv, c, Dv], qk [B, Hv, c, c], end_gate [B, Hv, 1]): the outputs and writes u [B, Hv, c, Dv] and the
    states at the chunk's end [B, Hv, Dk, Dv]."""
    size = ops.gather(ops.shape_of(qk, ov.Type.i64), i64([3]), i64(0))  # [1]: c
    both, end_k = ops.variadic_split(reads, i64(2), ops.concat([ops.multiply(size, i64(2)), size], 0)).outputs()
    recalled, read = ops.split(ops.matmul(both, state, False, False), i64(2), 2).outputs()  # [B, Hv, c, Dv]
    u = ops.subtract(writes, recalled)  # [B, Hv, c, Dv]
    out = ops.add(read, ops.matmul(qk, u, False, False))  # [B, Hv, c, Dv]
    end = ops.multiply(state, ops.unsqueeze(end_gate, i64([-1])))  # [B, Hv, Dk, Dv]
    end = ops.add(end, ops.matmul(end_k, u, True, False))  # [B, Hv, Dk, Dv]
    return out.output(0), u.output(0), end.output(0)


def _round_loop(
    tensors: dict[str, Output], state: Output, layout: _Layout, rows: _StateRows, at: str
) -> tuple[Output, Output, Output]:
    """One Loop iteration per round over the chunk tensors [P, Hv, ...] from the states of the M sequences with later
    chunks (rank order): the outputs [R, M, Hv, c, Dv] (unused past A_j), their final states [M, Hv, Dk, Dv] and the
    states after the held rows [H, Hv, Dk, Dv]."""
    shape = state.get_partial_shape()
    heads, dk, dv = (shape[d].get_length() for d in (1, 2, 3))
    body_in = {name: ops.parameter(x.get_partial_shape(), ov.Type.f32, name=name) for name, x in tensors.items()}
    carried = ops.parameter([-1, heads, dk, dv], ov.Type.f32, name="state")
    held = ops.parameter([-1, heads, dk, dv], ov.Type.f32, name="held")
    iteration = ops.parameter([], ov.Type.i64, name="iteration")
    small = {name: ops.parameter([-1], ov.Type.i64, name=name) for name in ("active", "offset", "rank", "chunk", "row")}

    at_round = ops.unsqueeze(iteration, i64([0]))  # [1]
    taken = ops.gather(small["active"], at_round, i64(0))  # [1]: A_j
    begin = ops.gather(small["offset"], at_round, i64(0))  # [1]
    # rank r < A_j takes its chunk j, the others the chunk of no rows (the last): all M run, none moves
    multi = _count(carried)  # []: M
    ranks = ops.range(i64(0), multi, i64(1), ov.Type.i64)  # [M]
    nothing = ops.subtract(_count(body_in["writes"]), i64(1))  # []: the last chunk, of no rows
    picked = ops.select(ops.less(ranks, taken), ops.add(begin, ranks), nothing)  # [M]
    x = {name: ops.gather(body_in[name], picked, i64(0)) for name in _ROUND}  # round j's chunks: [M, Hv, ...]
    out, u, end = _chunk_step(*(x[name] for name in _ROUND), carried)  # [M, Hv, c, Dv], …, [M, Hv, Dk, Dv]

    # the held rows of this round (round j = iteration + 1)
    here = ops.reshape(ops.non_zero(ops.equal(small["chunk"], ops.add(iteration, i64(1)))), i64([-1]), False)  # [K]
    rank, row = (ops.gather(small[n], here, i64(0)) for n in ("rank", "row"))  # [K]
    picks = [ops.gather(body_in[n], ops.add(begin, rank), i64(0)) for n in _ROWS]  # [K, Hv, ...]
    states = _states_after(ops.gather(carried, rank, i64(0)), *picks, ops.gather(u, rank, i64(0)), row)
    held_new = ops.scatter_update(held, here, states, i64(0))  # [H, Hv, Dk, Dv]

    out = ops.unsqueeze(out, i64([0]))  # [1, M, Hv, c, Dv]

    go_on = ops.constant(np.bool_(True))
    params = [*body_in.values(), carried, held, iteration, *small.values()]
    results = [ops.result(go_on), ops.result(end), ops.result(held_new), ops.result(out)]
    trips = _count(layout.active)  # []: R
    node = Loop(trips, ops.constant(np.bool_(True)).output(0))
    node.set_function(ov.Model(results, params, f"{at}/round"))
    node.set_special_body_ports([params.index(iteration), 0])
    for name, value in tensors.items():
        node.set_invariant_input(body_in[name], value)
    node.set_merged_input(carried, first_output(state), results[1].output(0))
    zeros = ops.broadcast(
        const(0.0), ops.concat([ops.shape_of(rows.held, ov.Type.i64), i64([heads, dk, dv])], 0)
    )  # [H, Hv, Dk, Dv]
    node.set_merged_input(held, zeros.output(0), results[2].output(0))
    for name, index in (("active", layout.active), ("offset", layout.offset)):
        node.set_invariant_input(small[name], index)
    for name, index in (("rank", rows.rank), ("chunk", rows.chunk), ("row", rows.row)):
        node.set_invariant_input(small[name], ops.gather(index, rows.held, i64(0)).output(0))
    node.set_friendly_name(at)
    outputs = node.get_concatenated_slices(results[3].output(0), 0, 1, 1, -1, 0)
    final, held_out = (node.get_iter_value(r.output(0), -1) for r in results[1:3])
    return outputs, final, held_out


def _states_after(start: Output, gate: Output, decay: Output, k: Output, u: Output, row: Output) -> Output:
    """The states after K rows, exp(γ_t) S₀ + Σ_s D_ts k_s ⊗ u_s, from the states entering their chunks
    (start [K, Hv, Dk, Dv]), their chunks' gate [K, Hv, c], decay [K, Hv, c, c], k [K, Hv, c, Dk], u [K, Hv, c, Dv]
    and the row within the chunk [K]. Returns [K, Hv, Dk, Dv]."""
    weights = ops.squeeze(ops.gather(decay, ops.unsqueeze(row, i64([1])), i64(2), 1), i64([2]))  # [K, Hv, c]: D_t·
    row_gate = ops.gather(gate, ops.unsqueeze(row, i64([1])), i64(2), 1)  # [K, Hv, 1]: exp(γ_t)
    states = ops.matmul(ops.multiply(k, ops.unsqueeze(weights, i64([-1]))), u, True, False)  # [K, Hv, Dk, Dv]
    return ops.add(states, ops.multiply(start, ops.unsqueeze(row_gate, i64([-1])))).output(0)


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
    the inverse of the 2b-block diagonal part is T − T E T (exactly: E T E = 0). log2(c) rounds of two MatMuls (an
    earlier attempt found a power series for the inverse unstable in f32).
    """
    inverse = None
    for mask in rounds:
        joins = ops.select(mask, lower, const(0.0))  # [..., c, c]: E
        if inverse is None:  # T = I for 1x1 blocks
            inverse = ops.subtract(_eye_like(lower), joins)
        else:
            inverse = ops.subtract(inverse, ops.matmul(ops.matmul(inverse, joins, False, False), inverse, False, False))
    return _eye_like(lower) if inverse is None else inverse


def _count(x: Output) -> Output:
    """x's leading dimension, as a scalar i64."""
    return ops.gather(ops.shape_of(x, ov.Type.i64), i64(0), i64(0)).output(0)


def _eye_like(x: Output) -> Output:
    """The identity [c, c] for x [..., c, c]."""
    size = ops.gather(ops.shape_of(x, ov.Type.i64), i64(-1), i64(0))  # []
    index = ops.range(i64(0), size, i64(1), ov.Type.i64)  # [c]
    eye = ops.equal(ops.unsqueeze(index, i64([1])), ops.unsqueeze(index, i64([0])))  # [c, c]
    return ops.convert(eye, ov.Type.f32).output(0)

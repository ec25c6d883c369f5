"""The graph's delta rule (chunked, and the per-row Loop it replaced) against the numpy recurrent rule on ragged packed
sequences: outputs of every row and the states after chosen rows, inside chunks and at sequences' ends."""

from __future__ import annotations

import numpy as np
import openvino as ov
import pytest
from openvino import opset16

from ovbuild.graph.gated_delta import delta_rule_loop
from ovbuild.graph.gated_delta_chunked import delta_rule_chunked
from ovbuild.graph.ops import result
from ovbuild.graph.step_grid import step_grid
from ovbuild.ir import core
from ovbuild.reference.gated_delta import delta_rule_recurrent
from ovbuild.testing import F32_NMSE, nmse


def bare_input(name: str, shape: list[int], dtype: ov.Type) -> ov.Node:
    """An input of a test subgraph (not an IR port): its tensor named as its friendly name."""
    p = opset16.parameter(shape, dtype, name=name)
    p.output(0).set_names({name})
    return p


HEADS, DK, DV = 3, 8, 6
GARBAGE = {"q": 7.0, "k": 7.0, "v": 7.0, "g": 50.0, "beta": 0.9}  # past a sequence's end: must never be read


def compiled(chunk: int) -> ov.CompiledModel:
    """The rule on [S, L] grid inputs (chunk 0: the per-row Loop); outputs gathered back to packed rows."""
    q, k = (bare_input(n, [-1, -1, HEADS, DK], ov.Type.f32) for n in "qk")
    v = bare_input("v", [-1, -1, HEADS, DV], ov.Type.f32)
    g, beta = (bare_input(n, [-1, -1, HEADS], ov.Type.f32) for n in ("g", "beta"))
    state = bare_input("state", [-1, HEADS, DK, DV], ov.Type.f32)
    begins = bare_input("subsequence_begins", [-1], ov.Type.i32)
    rows = bare_input("rows", [-1], ov.Type.i64)
    state_rows = bare_input("state_rows", [-1], ov.Type.i64)
    grid = step_grid(begins.output(0), state_rows.output(0), rows.output(0))
    args = (q.output(0), k.output(0), v.output(0), g.output(0), beta.output(0), state.output(0), grid, "test")
    out, states = delta_rule_chunked(*args, chunk=chunk) if chunk else delta_rule_loop(*args)
    outputs = [result(out, "out"), result(states, "states")]
    model = ov.Model(outputs, [q, k, v, g, beta, state, begins, rows, state_rows], "delta_rule")
    return core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})


def sequences(lengths, rng, decay: float = 1.0, same_keys: bool = False) -> list[dict[str, np.ndarray]]:
    def unit(shape):
        x = rng.standard_normal(shape)
        return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)

    out = []
    for n in lengths:
        k = unit((1, HEADS, DK)).repeat(n, 0) + 0.01 * unit((n, HEADS, DK)) if same_keys else unit((n, HEADS, DK))
        seq = {
            "q": unit((n, HEADS, DK)) / np.float32(np.sqrt(DK)),
            "k": k / np.linalg.norm(k, axis=-1, keepdims=True),
            "v": rng.standard_normal((n, HEADS, DV)),
            "g": -decay * rng.uniform(0, 1, (n, HEADS)),
            "beta": rng.uniform(0, 1, (n, HEADS)),
            "state": rng.standard_normal((HEADS, DK, DV)),
        }
        out.append({name: x.astype(np.float32) for name, x in seq.items()})
    return out


def feed(seqs, state_rows) -> dict[str, np.ndarray]:
    """The grid inputs of packed sequences, garbage past each sequence's end."""
    lengths = [len(s["q"]) for s in seqs]
    steps = max(lengths)
    inputs = {}
    for name, fill in GARBAGE.items():
        grid = np.full((len(seqs), steps, *seqs[0][name].shape[1:]), fill, np.float32)
        for i, s in enumerate(seqs):
            grid[i, : len(s[name])] = s[name]
        inputs[name] = grid
    begins = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    inputs["state"] = np.stack([s["state"] for s in seqs])
    inputs["subsequence_begins"] = begins
    inputs["rows"] = np.zeros(begins[-1], np.int64)
    inputs["state_rows"] = np.asarray(state_rows, np.int64)
    return inputs


def reference(seqs, state_rows) -> tuple[np.ndarray, np.ndarray]:
    """The recurrent rule in f64 per sequence: packed outputs [T, Hv, Dv] and the states after state_rows."""
    outs, states = [], []
    for s in seqs:
        o, st = delta_rule_recurrent(*(s[n].astype(np.float64) for n in ("q", "k", "v", "g", "beta", "state")))
        outs.append(o)
        states += st
    kept = np.stack(states)[np.asarray(state_rows, np.int64)] if len(state_rows) else np.zeros((0, HEADS, DK, DV))
    return np.concatenate(outs), kept


def run(chunk: int, seqs, state_rows) -> tuple[np.ndarray, np.ndarray]:
    request = compiled(chunk).create_infer_request()
    request.infer(feed(seqs, state_rows))
    return request.get_tensor("out").data.copy(), request.get_tensor("states").data.copy()


@pytest.mark.parametrize("chunk", [0, 1, 4, 16, 32, 64])
def test_ragged_sequences_every_row(chunk):
    """Lengths 1, 5, 33, 70 in one call (70 rows: more than 4 chunks of 16), every row's state reported."""
    seqs = sequences([1, 5, 33, 70], np.random.default_rng(7))
    rows = np.arange(1 + 5 + 33 + 70)
    out, states = run(chunk, seqs, rows)
    ref_out, ref_states = reference(seqs, rows)
    print(f"chunk {chunk}: outputs NMSE {nmse(out, ref_out):.1e}, states NMSE {nmse(states, ref_states):.1e}")
    assert nmse(out, ref_out) < F32_NMSE and nmse(states, ref_states) < F32_NMSE
    assert nmse(ref_states[-1], seqs[-1]["state"]) > 0.01, "the state must change, or the test proves nothing"


@pytest.mark.parametrize("chunk", [0, 32])
def test_decode_call(chunk):
    """One row per sequence (a chunk of one row), states in any order."""
    seqs = sequences([1, 1, 1], np.random.default_rng(6))
    out, states = run(chunk, seqs, [2, 0, 1, 2])
    ref_out, ref_states = reference(seqs, [2, 0, 1, 2])
    assert nmse(out, ref_out) < F32_NMSE and nmse(states, ref_states) < F32_NMSE


def test_chosen_state_rows_in_any_order():
    """A few state rows, unsorted and repeated: sequences' last rows, rows inside a chunk, a chunk's first and last."""
    lengths = [70, 5, 33, 1]
    seqs = sequences(lengths, np.random.default_rng(5))
    begins = np.concatenate([[0], np.cumsum(lengths)])
    rows = [begins[1] - 1, begins[2] + 2, 37, 16, 15, begins[3] - 1, 0, begins[4] - 1, 37, begins[2] + 20]
    out, states = run(16, seqs, rows)
    ref_out, ref_states = reference(seqs, rows)
    assert states.shape == (len(rows), HEADS, DK, DV)
    assert nmse(out, ref_out) < F32_NMSE and nmse(states, ref_states) < F32_NMSE


def test_a_sequence_without_rows():
    """A sequence of no rows among others (its chunk is all padding) disturbs nothing."""
    seqs = sequences([40, 0, 3], np.random.default_rng(1))
    out, states = run(16, seqs, [0, 39, 40, 42])
    ref_out, ref_states = reference(seqs, [0, 39, 40, 42])
    assert nmse(out, ref_out) < F32_NMSE and nmse(states, ref_states) < F32_NMSE


def test_no_state_rows():
    seqs = sequences([3, 40], np.random.default_rng(2))
    out, states = run(16, seqs, [])
    ref_out, _ = reference(seqs, [])
    assert states.shape == (0, HEADS, DK, DV)
    assert nmse(out, ref_out) < F32_NMSE


@pytest.mark.parametrize("decay", [30.0, 300.0])
def test_strong_decay_does_not_overflow(decay):
    """Log decays down to -decay per row: exp(γ_t - γ_s) of rows far apart underflows to 0 and must not overflow for
    s > t (exp(+Σ|g|)), nor turn 0 * inf into NaN."""
    lengths = [64, 20]
    seqs = sequences(lengths, np.random.default_rng(3), decay=decay)
    rows = np.arange(sum(lengths))
    out, states = run(64, seqs, rows)
    ref_out, ref_states = reference(seqs, rows)
    assert np.isfinite(out).all() and np.isfinite(states).all()
    assert nmse(out, ref_out) < F32_NMSE and nmse(states, ref_states) < F32_NMSE


def test_nearly_equal_keys():
    """Keys of a chunk nearly parallel, the least favourable triangular system: its inverse stays accurate in f32."""
    seqs = sequences([64, 50], np.random.default_rng(4), decay=0.01, same_keys=True)
    rows = np.arange(114)
    out, states = run(64, seqs, rows)
    ref_out, ref_states = reference(seqs, rows)
    print(f"nearly equal keys: outputs NMSE {nmse(out, ref_out):.1e}, states NMSE {nmse(states, ref_states):.1e}")
    assert nmse(out, ref_out) < F32_NMSE and nmse(states, ref_states) < F32_NMSE


def test_chunk_must_be_a_power_of_two():
    with pytest.raises(ValueError, match="power of two"):
        compiled(48)

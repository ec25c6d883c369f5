"""The packed grouped dynamic convolution graph against the plain-loop reference, one block at a time."""

from __future__ import annotations

import numpy as np
import openvino as ov
import pytest
from openvino import opset16

from ovbuild.graph.conv import block_row_index, grouped_dynamic_conv, tap_masks
from ovbuild.graph.ops import result
from ovbuild.ir import core
from ovbuild.reference.dflash2 import grouped_dynamic_conv as conv_loop
from ovbuild.testing import F32_NMSE, nmse


def bare_input(name: str, shape: list[int], dtype: ov.Type) -> ov.Node:
    """An input of a test subgraph (not an IR port): its tensor named as its friendly name."""
    p = opset16.parameter(shape, dtype, name=name)
    p.output(0).set_names({name})
    return p


HIDDEN, GROUP_SIZE = 64, 16
GROUPS = HIDDEN // GROUP_SIZE
# (context rows, block rows) per sequence: a block opens the pack, a one-row block, a sequence with context only, a
# block right after another sequence's context, blocks of two sequences back to back, a two-row block closing the pack.
LAYOUT = [(0, 5), (3, 1), (4, 0), (0, 8), (2, 3), (0, 2)]


def conv_model(base: np.ndarray) -> ov.CompiledModel:
    k = base.shape[0]
    z = bare_input("z", [-1, HIDDEN], ov.Type.f32)
    dyn = bare_input("dyn", [-1, k, GROUPS], ov.Type.f32)
    token_type_ids = bare_input("token_type_ids", [-1], ov.Type.i32)
    begins = bare_input("subsequence_begins", [-1], ov.Type.i32)
    masks = tap_masks(block_row_index(token_type_ids.output(0), begins.output(0)), k)
    out = grouped_dynamic_conv(z.output(0), dyn.output(0), base, masks, GROUP_SIZE, "conv")
    model = ov.Model([result(out, "out")], [z, dyn, token_type_ids, begins], "conv")
    return core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})


def packed_inputs(layout, k: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    rows = sum(c + b for c, b in layout)
    return {
        "z": rng.standard_normal((rows, HIDDEN)).astype(np.float32),
        "dyn": rng.standard_normal((rows, k, GROUPS)).astype(np.float32),
        "token_type_ids": np.array([t for c, b in layout for t in [0] * c + [1] * b], np.int32),
        "subsequence_begins": np.cumsum([0] + [c + b for c, b in layout]).astype(np.int32),
    }


def blocks(layout):
    """Row range of each sequence's block in the pack."""
    start = 0
    for c, b in layout:
        yield range(start + c, start + c + b)
        start += c + b


@pytest.mark.parametrize("k", [1, 2, 3])
def test_packed_conv_matches_plain_loop_per_block(k):
    rng = np.random.default_rng(k)
    base = (0.5 * rng.standard_normal((k, HIDDEN)) + np.eye(k, 1).reshape(k, 1)).astype(np.float32)
    inputs = packed_inputs(LAYOUT, k, rng)
    out = conv_model(base)(inputs)["out"]
    z, dyn = inputs["z"].astype(np.float64), inputs["dyn"].astype(np.float64)
    block_rows = np.array([r for rows in blocks(LAYOUT) for r in rows])
    ref = np.concatenate([conv_loop(z[list(rows)], dyn[list(rows)], base, GROUP_SIZE) for rows in blocks(LAYOUT)])
    err = nmse(out[block_rows], ref)
    print(f"kernel {k}: packed conv vs plain loop over {len(LAYOUT)} sequences, NMSE {err:.2e}")
    assert err < F32_NMSE, f"kernel {k}: packed conv vs plain loop, NMSE {err:.2e}"
    if k > 1:  # negative control: one loop over the whole pack lets taps cross block starts, and that shows
        crossing = conv_loop(z, dyn, base, GROUP_SIZE)[block_rows]
        assert nmse(out[block_rows], crossing) > 1e-2, "the pack-wide loop agrees: taps never reached a block start"


def test_block_row_index_restarts_per_block_and_is_negative_on_context_rows():
    tt = bare_input("token_type_ids", [-1], ov.Type.i32)
    begins = bare_input("subsequence_begins", [-1], ov.Type.i32)
    graph = ov.Model([result(block_row_index(tt.output(0), begins.output(0)), "index")], [tt, begins], "index")
    inputs = packed_inputs(LAYOUT, 1, np.random.default_rng(0))
    got = core().compile_model(graph, "CPU")(
        {"token_type_ids": inputs["token_type_ids"], "subsequence_begins": inputs["subsequence_begins"]}
    )["index"]
    np.testing.assert_array_equal(got, np.concatenate([[-1] * c + list(range(b)) for c, b in LAYOUT]))

"""Small graph helpers that every builder relies on."""

from __future__ import annotations

import numpy as np
import openvino as ov
import openvino.opset16 as ops

from ovbuild.graph.ops import argmax
from ovbuild.graph.packed import window_band


def test_argmax_equals_numpy_with_ties_at_both_ends():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((9, 37)).astype(np.float32)
    x[0, [0, 5, 36]] = 10.0  # ties: numpy keeps the first index
    x[1, [3, 36]] = 10.0
    x[2, :] = -1.0  # a constant row: index 0
    x[3, 36] = np.inf
    x[4, :] = -np.inf
    x[5, [2, 4]] = np.inf
    p = ops.parameter([-1, 37], ov.Type.f32)
    compiled = ov.Core().compile_model(ov.Model([argmax(p.output(0), "argmax")], [p]), "CPU")
    got = compiled([x])[0]
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, x.argmax(-1))


def test_argmax_points_at_a_maximum_under_bf16_inference():
    """With bf16 math the plugin may lower the logits' precision; the argmax must still pick a largest logit."""
    rng = np.random.default_rng(1)
    h = ops.parameter([-1, 64], ov.Type.f32)
    w = ops.constant(rng.standard_normal((64, 4096)).astype(np.float32))
    logits = ops.matmul(h, w, False, False)
    model = ov.Model([logits.output(0), argmax(logits.output(0), "argmax")], [h])
    compiled = ov.Core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "bf16"})
    out = compiled([rng.standard_normal((16, 64)).astype(np.float32)])
    values, ids = out[0], out[1]
    np.testing.assert_array_equal(values[np.arange(16), ids], values.max(-1))


def test_window_band_is_each_sequences_row_major_band():
    """qq_bias of sequences with 5, 0, 1, 3, 0 and 40 new rows: per sequence, n x n with 1 where |i - j| < 3."""
    counts = [5, 0, 1, 3, 0, 40]
    begins = ops.parameter([-1], ov.Type.i32)
    bias, bias_begins = window_band(begins.output(0), 3, "band")
    compiled = ov.Core().compile_model(ov.Model([bias, bias_begins], [begins]), "CPU")
    got, got_begins = compiled([np.cumsum([0, *counts]).astype(np.int32)]).values()
    expected = [
        [int(abs(i - j) < 3) for i in range(n) for j in range(n)]  # row i, column j
        for n in counts
    ]
    assert got.dtype == np.uint8 and got_begins.dtype == np.int32
    assert got.tolist() == [v for band in expected for v in band]
    assert got_begins.tolist() == np.cumsum([0] + [n * n for n in counts]).tolist()

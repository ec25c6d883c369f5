"""Narrow float weights: a bf16 or f16 checkpoint's matrices stay in their stored precision in the CPU plugin where
it computes in that precision (ovbuild.runtime.narrow_weights), and the logits and taps are bitwise those of the same
model with its weights widened to f32 first."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import openvino as ov
import pytest

from ovbuild.graph.target import build_target
from ovbuild.runtime import paged_model
from ovbuild.runtime.kv_cache import sequence_rows
from ovbuild.runtime.narrow_weights import DECOMPRESSION, narrow_type, narrow_weights, weight_converts
from ovbuild.runtime.paged_model import TAPS, PagedModel
from ovbuild.testing import TINY_TARGET, write_tiny_target
from ovbuild.weights.checkpoint import Checkpoint
from ovbuild.weights.target import load_target

VOCAB = TINY_TARGET["vocab_size"]
STORED = {"bf16": ov.Type.bf16, "f16": ov.Type.f16}


@pytest.fixture(scope="module", params=sorted(STORED))
def narrow_target(request, tmp_path_factory) -> Iterator[tuple[str, ov.Model]]:
    """(dtype, the tiny target IR from a checkpoint stored in dtype, with taps of two layers)."""
    folder = write_tiny_target(tmp_path_factory.mktemp("narrow") / request.param, dtype=request.param)
    cfg, weights = load_target(Checkpoint.open(folder))
    # `weights` held while the module runs: the IR's Constants share the checkpoint's mapped file (stored_constant)
    yield request.param, build_target(cfg, weights, (1, 3))
    del weights


def matrix_types(compiled: ov.CompiledModel) -> set[ov.Type]:
    """The precisions the plugin keeps the matrices of its FullyConnected nodes in (the compiled graph's view)."""
    runtime = compiled.get_runtime_model()
    nodes = [n for n in runtime.get_ops() if n.get_rt_info()["layerType"].astype(str) == "FullyConnected"]
    assert nodes, "the compiled model has no FullyConnected node"
    return {n.input_value(1).get_element_type() for n in nodes}


@pytest.mark.parametrize("math", ["f32", "bf16"])
def test_matrices_stay_in_their_stored_precision_where_the_math_is_the_same(narrow_target, math):
    dtype, model = narrow_target
    target = PagedModel(model, kv_cache_precision="f16", inference_precision=math, num_blocks=8)
    assert target.static is not None, "the tiny target runs in static copies"
    copy_request, _ = target.static.copy(4)
    # Where the CPU has no bf16 units the plugin computes in f32, and an f32 copy of the weights is what it needs.
    bf16_units = "BF16" in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")
    assert narrow_type("CPU", math) == (ov.Type.bf16 if math == "bf16" and bf16_units else None)
    narrow = narrow_type("CPU", math) == STORED[dtype]
    for compiled in (target.compiled, copy_request.get_compiled_model()):
        kept = matrix_types(compiled)
        if narrow:
            assert kept == {STORED[dtype]}, f"{dtype} weights under {math} math kept as {kept}"
        else:
            assert kept == {ov.Type.f32}, f"{dtype} weights under {math} math kept as {kept}, not widened once to f32"


def call(model: PagedModel, past: int, tokens: list[int], one_per_row: bool) -> dict[str, np.ndarray]:
    """One call of `tokens` after `past` cached tokens of sequence 0, every row's logits asked for."""
    rows = sequence_rows(0, past, len(tokens), one_per_row)
    inputs = {"input_ids": tokens, "position_ids": list(range(past, past + len(tokens)))}
    return model.run(rows, {**inputs, "logits_indices": list(range(len(tokens)))})


@pytest.mark.parametrize("math", ["f32", "bf16"])
def test_narrow_weights_compute_the_widened_weights_logits_and_taps_bitwise(narrow_target, math, monkeypatch):
    dtype, model = narrow_target
    narrow = PagedModel(model, kv_cache_precision="f16", inference_precision=math, num_blocks=16)
    with monkeypatch.context() as patch:
        patch.setattr(paged_model, "narrow_weights", lambda model, device, precision: model)
        # a clone: static copies are shared between models compiled alike from one caller's model
        widened = PagedModel(model.clone(), kv_cache_precision="f16", inference_precision=math, num_blocks=16)
    if narrow_type("CPU", math) == STORED[dtype]:
        assert matrix_types(narrow.compiled) != matrix_types(widened.compiled), "the two models compiled alike"
    rng = np.random.default_rng(3)
    # a prompt longer than the largest copy (the dynamic model), then verification- and chunk-shaped calls (copies)
    schedule = [(70, False), (1, True), (3, True), (8, True), (5, False), (2, True)]
    past = 0
    for size, one_per_row in schedule:
        tokens = rng.integers(0, VOCAB, size).tolist()
        a, b = call(narrow, past, tokens, one_per_row), call(widened, past, tokens, one_per_row)
        for name in ("logits", TAPS):
            np.testing.assert_array_equal(a[name], b[name], err_msg=f"{name} of the call at {past}")
        past += size


def test_the_callers_model_is_left_unmarked(narrow_target):
    """Callers compile one model many ways (f32 and bf16 math, static copies): only the returned copy is marked."""
    dtype, model = narrow_target

    def marked(m: ov.Model) -> int:
        return sum(DECOMPRESSION in node.get_rt_info() for node in m.get_ops())

    narrow = narrow_weights(model, "CPU", "bf16")
    expected = len(weight_converts(model, STORED[dtype])) if narrow_type("CPU", "bf16") == STORED[dtype] else 0
    assert marked(narrow) == expected, f"{marked(narrow)} of the {dtype} weights' Converts marked, not {expected}"
    assert marked(model) == 0, "the caller's model was marked"

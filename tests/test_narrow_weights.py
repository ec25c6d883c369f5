"""Narrow float weights: a bf16 or f16 checkpoint's matrices stay in their stored precision in the CPU plugin where
it computes in that precision, or where widened they would not fit (ovbuild.runtime.model.narrow_weights), and the
logits and taps are those of the same model with its weights widened to f32 first (bitwise under bf16 math)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import openvino as ov
import pytest

from ovbuild.graph.target import build_target
from ovbuild.reference.layers import nmse
from ovbuild.runtime.cache.kv_cache import sequence_rows
from ovbuild.runtime.model import narrow_weights as narrowing
from ovbuild.runtime.model import paged_model
from ovbuild.runtime.model.narrow_weights import DECOMPRESSION, NARROW_FLOATS, narrow_weights, weight_converts
from ovbuild.runtime.model.paged_model import TAPS, PagedModel
from ovbuild.targets import load_target
from ovbuild.testing import F32_NMSE, TINY_TARGET, write_tiny_target
from ovbuild.weights.checkpoint import Checkpoint

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


def kept_narrow(dtype: str, math: str, short_of_memory: bool) -> bool:
    """Whether weights stored in `dtype` should stay so, written out: under bf16 math (which needs bf16 units, else
    the plugin computes in f32) bf16 weights; under f32 math any, on a machine too small for them widened."""
    bf16_math = math == "bf16" and "BF16" in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")
    return dtype == "bf16" if bf16_math else short_of_memory


def short_of_memory(monkeypatch) -> None:
    """Make this machine look too small for any weights widened to f32."""
    monkeypatch.setattr(narrowing, "physical_memory_mb", lambda: 1.0)


@pytest.mark.parametrize("math, short", [("f32", False), ("bf16", False), ("f32", True)])
def test_matrices_stay_in_their_stored_precision_where_they_should(narrow_target, math, short, monkeypatch):
    dtype, model = narrow_target
    if short:
        short_of_memory(monkeypatch)
    target = PagedModel(model.clone(), kv_cache_precision="f16", inference_precision=math, num_blocks=8)
    assert target.static is not None, "the tiny target runs in static copies"
    copy_request, _ = target.static.copy(4)
    narrow = kept_narrow(dtype, math, short)
    for compiled in (target.compiled, copy_request.get_compiled_model()):
        kept = matrix_types(compiled)
        expected = {STORED[dtype]} if narrow else {ov.Type.f32}
        assert kept == expected, f"{dtype} weights under {math} math (short of memory: {short}) kept as {kept}"


def call(model: PagedModel, past: int, tokens: list[int], one_per_row: bool) -> dict[str, np.ndarray]:
    """One call of `tokens` after `past` cached tokens of sequence 0, every row's logits asked for."""
    rows = sequence_rows(0, past, len(tokens), one_per_row)
    inputs = {"input_ids": tokens, "position_ids": list(range(past, past + len(tokens)))}
    return model.run(rows, {**inputs, "logits_indices": list(range(len(tokens)))})


@pytest.mark.parametrize("math, short", [("f32", False), ("bf16", False), ("f32", True)])
def test_narrow_weights_compute_the_widened_weights_logits_and_taps(narrow_target, math, short, monkeypatch):
    """Bitwise where the math is bf16 or the weights are widened anyway. Under f32 math, weights kept narrow go through
    other kernels, which may round otherwise (at Qwen3-4B's width: NMSE 6e-9, bench_narrow_weights.py, docs/speed.md):
    within the f32 bound there, as what speculation relies on is that rows compute alike in any call
    (test_static_rows.py)."""
    dtype, model = narrow_target
    with monkeypatch.context() as patch:
        if short:
            short_of_memory(patch)
        # clones: static copies are shared between models compiled alike from one caller's model
        narrow = PagedModel(model.clone(), kv_cache_precision="f16", inference_precision=math, num_blocks=16)
        patch.setattr(paged_model, "narrow_weights", lambda model, device, precision: model)
        widened = PagedModel(model.clone(), kv_cache_precision="f16", inference_precision=math, num_blocks=16)
    if kept_narrow(dtype, math, short):
        assert matrix_types(narrow.compiled) != matrix_types(widened.compiled), "the two models compiled alike"
    rng = np.random.default_rng(3)
    # a prompt longer than the largest copy (the dynamic model), then verification- and chunk-shaped calls (copies)
    schedule = [(70, False), (1, True), (3, True), (8, True), (5, False), (2, True)]
    past = 0
    for size, one_per_row in schedule:
        tokens = rng.integers(0, VOCAB, size).tolist()
        a, b = call(narrow, past, tokens, one_per_row), call(widened, past, tokens, one_per_row)
        for name in ("logits", TAPS):
            if math == "f32" and kept_narrow(dtype, math, short):
                error = nmse(a[name], b[name])
                assert error < F32_NMSE, f"{name} of the call at {past}: NMSE {error:.1e} against the widened weights"
            else:
                np.testing.assert_array_equal(a[name], b[name], err_msg=f"{name} of the call at {past}")
        past += size


def test_the_rule_on_a_cpu_with_bf16_units(narrow_target, bf16_units):
    """What the tests above check by compiling where the CPU has bf16 units, checked on every CPU on the model handed
    to the plugin: under bf16 math exactly the Converts of bf16 weights are marked (f16 weights' logits came out
    rounded otherwise), in a copy; under f32 math, on a machine with room for them widened, none."""
    dtype, model = narrow_target

    def marked(m: ov.Model) -> int:
        return sum(DECOMPRESSION in node.get_rt_info() for node in m.get_ops())

    # callers compile one model many ways (f32 and bf16 math, static copies): only the returned copy is marked
    converts = len(weight_converts(model, NARROW_FLOATS))
    assert converts > 0, "the tiny target has no narrow weights"
    assert marked(narrow_weights(model, "CPU", "bf16")) == (converts if dtype == "bf16" else 0)
    assert marked(model) == 0, "the caller's model was marked"
    assert narrow_weights(model, "CPU", "f32") is model

"""Native weight compression: nibble packing, round-to-nearest quantizers, exact decompression by the CPU plugin,
compressed kernels and accuracy of whole tiny models per weight format, rt_info, determinism."""

from __future__ import annotations

import contextlib
import gc
import re

import numpy as np
import openvino as ov
import openvino.opset16 as ops
import pytest

from ovbuild.errors import ConfigError, UnsupportedError
from ovbuild.graph.dflash import build_dflash_draft
from ovbuild.graph.quantize import rtn
from ovbuild.graph.quantize.decompression import compressed_constant
from ovbuild.graph.quantize.nibbles import pack_nibbles, unpack_nibbles
from ovbuild.graph.quantize.rtn import Scheme, dequantize, quantize
from ovbuild.graph.target import build_target
from ovbuild.graph.weights import WeightPolicy, stored_constant
from ovbuild.ir import core, read_ir, save_ir
from ovbuild.ir.rt_info import get_rt_info
from ovbuild.reference.dflash import DFlashReference
from ovbuild.reference.qwen3 import Qwen3Reference
from ovbuild.reference.weights import ReferenceWeights
from ovbuild.runtime.model.machine import describe
from ovbuild.runtime.model.paged_model import PagedModel
from ovbuild.targets import load_target
from ovbuild.testing import F32_NMSE, nmse, write_tiny_target
from ovbuild.weights.checkpoint import Checkpoint
from ovbuild.weights.dtypes import bf16_to_f32, f32_to_bf16
from ovbuild.weights.tensor import WeightTensor
from ovbuild.weights.tensor_names import WeightSource

from paged_helpers import run_draft, run_target

TAPS = (1, 3, 5)
_tokens = np.random.default_rng(5).integers(0, 256, 64).tolist()
# Packed prefill of three sequences (one longer than a cache block), then decode / verify / chunk in one call.
TARGET_SCHEDULE = [
    [(0, _tokens[:7], 7), (1, _tokens[7:47], 40), (2, _tokens[47:59], 12)],
    [(0, _tokens[59:60], 1), (1, _tokens[:5], 2), (2, _tokens[5:14], 9)],
]
MASK = 257
# (sequence, context rows, block): blocks of 8 rows after new context, then a step with a block only.
DRAFT_SCHEDULE = [
    [(0, 5, [11] + [MASK] * 7), (1, 37, [12] + [MASK] * 7)],
    [(0, 3, [14] + [MASK] * 7), (1, 0, [15] + [MASK] * 7)],
]
ROLES = ("linear", "embedding", "lm_head")
SCHEMES = {
    "u8": Scheme(8, False),
    "i8": Scheme(8, True),
    "u4 g16": Scheme(4, False, 16),
    "i4 g16": Scheme(4, True, 16),
    "u4 per channel": Scheme(4, False),
    "i4 per channel": Scheme(4, True),
}


@contextlib.contextmanager
def dynamic_quantization(group_size: int):
    """Compile with the CPU plugin's dynamic activation quantization set to `group_size` (0 = off), then restore."""
    before = core().get_property("CPU", "DYNAMIC_QUANTIZATION_GROUP_SIZE")
    core().set_property("CPU", {"DYNAMIC_QUANTIZATION_GROUP_SIZE": str(group_size)})
    try:
        yield
    finally:
        core().set_property("CPU", {"DYNAMIC_QUANTIZATION_GROUP_SIZE": str(before)})


def compile_f32(model: ov.Model) -> ov.CompiledModel:
    return core().compile_model(
        model, "CPU", {"INFERENCE_PRECISION_HINT": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": "0"}
    )


def kernels(compiled: ov.CompiledModel, layer_type: str) -> set[tuple[str, str]]:
    """(runtimePrecision, weight input element type) of every `layer_type` node the plugin really runs."""
    found = set()
    for node in compiled.get_runtime_model().get_ordered_ops():
        rt = node.get_rt_info()
        if rt["layerType"].astype(str) == layer_type:
            weight = node.input_value(1 if layer_type == "FullyConnected" else 0).get_element_type()
            found.add((rt["runtimePrecision"].astype(str), weight.get_type_name()))
    return found


def random_matrix(rng, n: int, k: int) -> np.ndarray:
    """Gaussian weights with a few outliers, an all-zero row and a row of tiny values."""
    w = rng.standard_normal((n, k)).astype(np.float32)
    w[1, ::7] *= 6.0
    w[2] = 0.0
    w[3] *= 1e-7
    return w


# --- packing and quantizers (numpy) ---------------------------------------------------------------------------


@pytest.mark.parametrize(("ov_type", "low", "high"), [(ov.Type.u4, 0, 15), (ov.Type.i4, -8, 7)])
def test_nibbles_pack_as_openvino_does_and_round_trip(ov_type, low, high):
    rng = np.random.default_rng(0)
    for count in (1, 2, 7, 64, 129):
        values = rng.integers(low, high + 1, count)
        packed = pack_nibbles(values)
        by_openvino = ov.op.Constant(ov_type, ov.Shape([count]), values.tolist()).data.view(np.uint8)
        assert np.array_equal(packed, by_openvino), f"{ov_type} x{count}: {packed} != OpenVINO's {by_openvino}"
        assert np.array_equal(unpack_nibbles(packed, count, signed=low < 0), values)


@pytest.mark.parametrize("name", list(SCHEMES))
def test_round_to_nearest_error_is_within_half_a_step(name):
    scheme = SCHEMES[name]
    n, k = 9, 64
    w = random_matrix(np.random.default_rng(1), n, k)
    q = quantize(WeightTensor("w", "f32", w), scheme)
    deq = dequantize(q)
    g = k if scheme.group_size == -1 else scheme.group_size
    step = np.repeat(np.abs(q.scale.astype(np.float32)).reshape(n, k // g), g, axis=1)
    codes = unpack_nibbles(q.codes, n * k, scheme.sym) if scheme.bits == 4 else q.codes
    low, high = (-(2 ** (scheme.bits - 1)), 2 ** (scheme.bits - 1) - 1) if scheme.sym else (0, 2**scheme.bits - 1)
    assert codes.min() >= low and codes.max() <= high
    err = np.abs(deq - w)
    # Symmetric: the group's extreme maps to the lowest code; the opposite side may clip by up to one step.
    clipped = (codes.reshape(n, k) == high) & scheme.sym
    assert np.all(err[~clipped] <= step[~clipped] / 2 * (1 + 1e-6)), f"{name}: error beyond half a step"
    assert np.all(err[clipped] <= step[clipped] * (1 + 1e-6))
    assert np.all(deq[2] == 0.0), "an all-zero row must dequantize to zeros"
    assert np.all(np.isfinite(q.scale)) and np.all(np.abs(q.scale) >= rtn.MIN_SCALE)
    weight_nmse = nmse(deq, w)
    print(f"{name}: weight NMSE {weight_nmse:.2e}")
    assert weight_nmse < (1e-4 if scheme.bits == 8 else 2e-2), f"{name}: weight NMSE {weight_nmse:.2e}"


@pytest.mark.parametrize("scheme", [Scheme(4, False), Scheme(4, True, 3), Scheme(8, False)])
def test_chunked_quantization_equals_one_shot(monkeypatch, scheme):
    """Rows are quantized a chunk at a time; odd row and input counts exercise 4-bit packing across chunks."""
    w = WeightTensor("w", "bf16", f32_to_bf16(random_matrix(np.random.default_rng(2), 11, 63)))
    whole = quantize(w, scheme)
    monkeypatch.setattr(rtn, "CHUNK_WEIGHTS", 63 * 2)
    chunked = quantize(w, scheme)
    for a, b in [(whole.codes, chunked.codes), (whole.scale, chunked.scale), (whole.zero_point, chunked.zero_point)]:
        assert (a is None and b is None) or np.array_equal(a, b)


def test_group_size_that_does_not_divide_the_inputs_is_an_error(target):
    with pytest.raises(ConfigError, match=r"'model\.layers\.0\.self_attn\.q_proj\.weight': group_size 48 .* 64 inputs"):
        build_target(*target, policy=WeightPolicy("int4", group_size=48))
    with pytest.raises(ConfigError, match="group_size 128 does not divide its 64 inputs"):
        build_target(*target, policy=WeightPolicy("int4"))  # the default group, on the tiny hidden size 64


def test_policy_follows_optimum_intel_per_role():
    linear, embedding, lm_head = (WeightPolicy("int4", sym=True, group_size=32).scheme(r) for r in ROLES)
    assert linear == Scheme(4, True, 32)
    assert embedding == lm_head == Scheme(8, False), "int4 backs the embedding and lm_head up with int8 asym"
    assert WeightPolicy("int4", all_layers=True, group_size=32).scheme("embedding") == Scheme(4, False, 32)
    assert {WeightPolicy("int8", sym=True).scheme(r) for r in ROLES} == {Scheme(8, True)}
    assert WeightPolicy("fp16").scheme("linear") is None
    assert WeightPolicy("int4").uncompressed() == WeightPolicy(), "Markov heads keep the checkpoint precision"
    assert WeightPolicy("fp16").uncompressed() == WeightPolicy("fp16")
    with pytest.raises(UnsupportedError, match="int2"):
        WeightPolicy("int2")
    with pytest.raises(ConfigError, match="group_size 0"):
        WeightPolicy("int4", group_size=0)
    with pytest.raises(UnsupportedError, match="'conv'"):
        WeightPolicy("int8").scheme("conv")


# --- what the CPU plugin makes of one compressed matrix -------------------------------------------------------


@pytest.mark.parametrize("name", list(SCHEMES))
def test_cpu_runs_compressed_kernels_on_exactly_the_numpy_dequantization(name):
    scheme = SCHEMES[name]
    n, k = 48, 64
    tensor = WeightTensor("w", "f32", random_matrix(np.random.default_rng(3), n, k))
    expected = dequantize(quantize(tensor, scheme))
    x = ops.parameter([-1, k], ov.Type.f32, name="x")
    ids = ops.parameter([-1], ov.Type.i64, name="ids")
    fc = ops.matmul(x, compressed_constant(tensor, scheme, "fc"), False, True)
    rows = ops.gather(compressed_constant(tensor, scheme, "table"), ids, ops.constant(np.int64(0)))
    gc.collect()  # the codes must live in buffers the model owns
    compiled = compile_f32(ov.Model([ops.result(fc), ops.result(rows)], [x, ids]))
    out = compiled.create_infer_request().infer({"x": np.eye(k, dtype=np.float32), "ids": np.arange(n)})
    assert np.array_equal(out[0].T, expected), f"{name}: FullyConnected weights differ from numpy dequantization"
    assert np.array_equal(out[1], expected), f"{name}: gathered rows differ from numpy dequantization"
    assert kernels(compiled, "FullyConnected") == {(scheme.storage, scheme.storage)}
    assert kernels(compiled, "Gather") == {(scheme.storage, scheme.storage)}


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_converted_and_copied_float_constants_own_their_memory(dtype):
    """Casts and non-checkpoint arrays go into buffers the Constant owns (an ov.Tensor over numpy would dangle)."""
    w = np.random.default_rng(4).standard_normal((32, 64)).astype(np.float32)
    rounded = w.astype(np.float16).astype(np.float32) if dtype == "f16" else bf16_to_f32(f32_to_bf16(w))
    x = ops.parameter([-1, 64], ov.Type.f32, name="x")
    cast = stored_constant(WeightTensor("w", "f32", w.copy()), "cast", dtype)
    stored = f32_to_bf16(w) if dtype == "bf16" else w.astype(np.float16)
    copied = stored_constant(WeightTensor("w", dtype, stored), "copied")
    model = ov.Model([ops.result(ops.matmul(x, c, False, True)) for c in (cast, copied)], [x])
    del stored
    gc.collect()
    _ = [np.full((32, 64), 7.0, np.float32) for _ in range(64)]  # reuse freed memory, if any was freed
    out = compile_f32(model).create_infer_request().infer({"x": np.eye(64, dtype=np.float32)})
    assert np.array_equal(out[0].T, rounded) and np.array_equal(out[1].T, rounded)


# --- whole tiny models per weight format ----------------------------------------------------------------------

# policy, NMSE bound of logits against the f32 IR, FullyConnected and Gather (precision, weight type) expected.
# Bounds hold for the tiny random checkpoints (Gaussian 64-wide matrices; the 6-layer target accumulates more error
# than the 2-layer draft). With f32 inference the CPU plugin widens f16 / bf16 FC weights to f32 at compile time
# (it keeps them for f16 / bf16 inference); the embedding Gather reads the f16 / bf16 table itself.
FORMATS = {
    "fp16": (WeightPolicy("fp16"), 2e-6, {("f32", "f32")}, {("f16", "f16"), ("f32", "f32")}),
    "bf16": (WeightPolicy("bf16"), 1e-4, {("f32", "f32")}, {("bf16", "bf16"), ("f32", "f32")}),
    "int8": (WeightPolicy("int8"), 1e-3, {("u8", "u8")}, {("u8", "u8"), ("f32", "f32")}),
    "int8 sym": (WeightPolicy("int8", sym=True), 1e-3, {("i8", "i8")}, {("i8", "i8"), ("f32", "f32")}),
    "int4 g32": (
        WeightPolicy("int4", group_size=32),
        0.15,
        {("u4", "u4"), ("u8", "u8")},
        {("u8", "u8"), ("f32", "f32")},
    ),
    "int4 sym g64": (
        WeightPolicy("int4", sym=True, group_size=64),
        0.15,
        {("i4", "i4"), ("u8", "u8")},
        {("u8", "u8"), ("f32", "f32")},
    ),
    "int4 per channel": (
        WeightPolicy("int4", group_size=-1),
        0.15,
        {("u4", "u4"), ("u8", "u8")},
        {("u8", "u8"), ("f32", "f32")},
    ),
    "int4 all layers": (
        WeightPolicy("int4", group_size=32, all_layers=True),
        0.15,
        {("u4", "u4")},
        {("u4", "u4"), ("f32", "f32")},
    ),
}


class StoredWeights(ReferenceWeights):
    """The reference's weights as `policy` stores them, read back as f32: the weights a compressed IR computes with.
    Tensor roles follow the builders' names (embed_tokens, lm_head; any other matrix is a linear layer)."""

    def __init__(self, source: WeightSource, policy: WeightPolicy):
        super().__init__(source)
        self.policy = policy

    def get(self, canonical: str, shape: tuple[int, ...]) -> np.ndarray:
        values = super().get(canonical, shape)
        if values.ndim != 2:
            return values
        t = WeightTensor(canonical, "f32", values.astype(np.float32))  # exact: f32 or bf16 values widened
        scheme = self.policy.scheme({"embed_tokens": "embedding", "lm_head": "lm_head"}.get(canonical, "linear"))
        if scheme is not None:
            return dequantize(quantize(t, scheme)).astype(np.float64)
        rounded = {"f16": lambda v: v.astype(np.float16), "bf16": lambda v: bf16_to_f32(f32_to_bf16(v))}
        dtype = self.policy.float_dtype(t)
        return (rounded[dtype](t.array) if dtype in rounded else t.array).astype(np.float64)


def logits(outputs) -> np.ndarray:
    return np.concatenate([c[s]["logits"].ravel() for c in outputs.ir for s in sorted(c)])


@pytest.fixture(scope="module")
def f32_logits(target, draft):
    """Logits of the f32 IRs over the parity schedules: the baseline every format is measured against."""
    t = PagedModel(build_target(*target, TAPS, WeightPolicy("fp32")), kv_cache_precision="f32")
    d = PagedModel(build_dflash_draft(*draft, target[1], WeightPolicy("fp32")), kv_cache_precision="f32")
    return (
        logits(run_target(t, Qwen3Reference(*target), TAPS, TARGET_SCHEDULE)),
        logits(run_draft(d, DFlashReference(*draft, target[1]), DRAFT_SCHEDULE)),
    )


@pytest.mark.parametrize("name", list(FORMATS))
def test_format_runs_compressed_kernels_within_its_nmse_bound(name, target, draft, f32_logits):
    policy, bound, fc_kernels, gather_kernels = FORMATS[name]
    stored_target = StoredWeights(target[1], policy)
    with dynamic_quantization(0):
        t = PagedModel(build_target(*target, TAPS, policy), kv_cache_precision="f32")
        d = PagedModel(build_dflash_draft(*draft, target[1], policy), kv_cache_precision="f32")
    assert kernels(t.compiled, "FullyConnected") == fc_kernels
    assert kernels(t.compiled, "Gather") == gather_kernels
    assert kernels(d.compiled, "FullyConnected") == fc_kernels
    t_out = run_target(t, Qwen3Reference(target[0], stored_target), TAPS, TARGET_SCHEDULE)
    d_out = run_draft(d, DFlashReference(draft[0], StoredWeights(draft[1], policy), stored_target), DRAFT_SCHEDULE)
    t_loss, d_loss = nmse(logits(t_out), f32_logits[0]), nmse(logits(d_out), f32_logits[1])
    print(f"{name}: logits NMSE vs f32 IR: target {t_loss:.2e}, draft {d_loss:.2e}")
    assert t_loss < bound and d_loss < bound, f"{name}: NMSE vs f32 IR target {t_loss:.2e}, draft {d_loss:.2e}"
    # Against the reference run with the stored weights the IR is as exact as the f32 build: nothing else changed.
    exact = max(t_out.nmse("logits"), t_out.nmse("hidden_states"), d_out.nmse("logits"))
    assert exact < F32_NMSE, f"{name}: IR vs reference with dequantized weights NMSE {exact:.2e}"


def test_dynamic_quantization_of_activations_is_bounded_and_off_is_exact(target, f32_logits):
    """DYNAMIC_QUANTIZATION_GROUP_SIZE 32 (the CPU default) may quantize FC activations to int8 on the fly: only where
    the CPU has int8 dot-product units. Everywhere: off is exact, on stays within 1e-3. Where the plugin reports bf16
    units (every such CPU has VNNI or AMX), it must really quantize."""
    policy = WeightPolicy("int8")
    ref = Qwen3Reference(target[0], StoredWeights(target[1], policy))
    losses = {}
    for group in (0, 32):
        with dynamic_quantization(group):
            model = PagedModel(build_target(*target, TAPS, policy), kv_cache_precision="f32")
        out = run_target(model, ref, TAPS, TARGET_SCHEDULE)
        losses[group] = (out.nmse("logits"), nmse(logits(out), f32_logits[0]))
    print(
        f"int8 target, dynamic quantization off / group 32: vs stored-weight reference {losses[0][0]:.2e} / "
        f"{losses[32][0]:.2e}; vs f32 IR {losses[0][1]:.2e} / {losses[32][1]:.2e} ({describe()})"
    )
    # Off, the IR computes exactly with the stored weights. CPUs without VNNI (AVX2-only) do not quantize activations
    # at all, so group 32 may be exact too; where it applies it costs NMSE 3.0e-4 (AVX-512 VNNI).
    assert losses[0][0] < F32_NMSE, f"dynamic quantization off: NMSE {losses[0][0]:.2e} vs stored-weight reference"
    assert losses[32][0] < 1e-3, f"dynamic quantization group 32: NMSE {losses[32][0]:.2e} (measured 3.0e-4)"
    if "BF16" in core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"):
        assert losses[32][0] > 1e-9, f"a CPU with bf16 units did not quantize activations: {losses}"


def test_static_copies_compile_with_the_settings_their_model_compiled_with(target):
    """Copies of a model for a row count are compiled on first use, maybe after the caller has put the plugin's
    settings back: they must run as their model does (else a row rounds otherwise in a copy than in the dynamic
    model, and where the CPU quantizes activations the copies would quantize while their model does not)."""
    policy = WeightPolicy("int8")
    with dynamic_quantization(0):
        model = PagedModel(build_target(*target, TAPS, policy), kv_cache_precision="f32")
    assert model.static is not None, "the tiny target runs in static copies"
    assert core().get_property("CPU", "DYNAMIC_QUANTIZATION_GROUP_SIZE") != 0, "the setting was not put back"
    request, _ = model.static.copy(4)
    setting = {
        m.get_property("DYNAMIC_QUANTIZATION_GROUP_SIZE") for m in (model.compiled, request.get_compiled_model())
    }
    assert setting == {0}, f"dynamic quantization group sizes of the model and its copy: {setting}"


def test_bf16_checkpoint_quantizes_from_its_bits(tmp_path):
    """int4 codes made from the bf16 bits match the reference's own dequantized weights. head_dim 16 makes
    heads * head_dim equal the hidden size, so o_proj is square: a widening that transposed square bf16 tensors
    (q, k and v are stacked before widening, so only o_proj is square here) would fail."""
    ckpt = write_tiny_target(tmp_path / "t", dtype="bf16", head_dim=16)
    cfg, weights = load_target(Checkpoint.open(ckpt))
    assert cfg.q_size == cfg.hidden_size
    policy = WeightPolicy("int4", sym=True, group_size=32)
    with dynamic_quantization(0):
        model = PagedModel(build_target(cfg, weights, TAPS, policy), kv_cache_precision="f32")
    out = run_target(model, Qwen3Reference(cfg, StoredWeights(weights, policy)), TAPS, TARGET_SCHEDULE)
    assert out.nmse("logits") < F32_NMSE, f"IR vs reference with dequantized bf16 weights {out.nmse('logits'):.2e}"


def test_ir_records_weight_format_and_is_byte_for_byte_deterministic(tmp_path, tiny_target, draft):
    policy = WeightPolicy("int4", sym=True, group_size=32)
    folders = []
    for run in ("a", "b"):
        cfg, weights = load_target(Checkpoint.open(tiny_target))  # a fresh read each time
        save_ir(build_target(cfg, weights, TAPS, policy), tmp_path / run / "openvino_model.xml")
        folders.append(tmp_path / run)
    a, b = ((f / "openvino_model.bin").read_bytes() for f in folders)
    assert a == b, "same checkpoint, same policy, different .bin"
    # Unnamed nodes (norm and RoPE arithmetic) get process-wide counters as names; everything else must match.
    a, b = (re.sub(r'name="[A-Za-z]+_\d+"', "", (f / "openvino_model.xml").read_text()) for f in folders)
    assert a == b, "same checkpoint, same policy, different .xml"
    model = read_ir(folders[0])
    recorded = {k: get_rt_info(model, f"ovbuild/{k}") for k in ("weight_format", "sym", "group_size", "all_layers")}
    assert recorded == {"weight_format": "int4", "sym": "True", "group_size": "32", "all_layers": "False"}
    d = build_dflash_draft(*draft, load_target(Checkpoint.open(tiny_target))[1], WeightPolicy("fp16"))
    assert get_rt_info(d, "ovbuild/weight_format") == "fp16" and get_rt_info(d, "ovbuild/sym") is None

"""Float weights kept in their stored precision by the CPU plugin: where it computes in that precision, or where
widened to f32 they would not fit the machine.

A bf16 or f16 checkpoint matrix is stored so in the IR and widened to f32 by a Convert after its Constant
(ovbuild.graph.weights.stored_constant). The CPU plugin folds an unmarked Convert: it keeps an f32 copy of every such
matrix beside the repacked one it computes with, 4x the stored bytes in all. A Convert marked as weight decompression
(OpenVINO's own mark, which its converters set on compressed float weights) is not folded: the plugin repacks the
stored matrix itself. With bf16 math that halved the demo target's memory (its copies and sibling: 533 MB against
1057 MB), four layers of Qwen3-4B's width peaked at 3.7 GB against 6.7 GB, calls ran as fast (0.98x-1.03x;
bench_narrow_weights.py, docs/speed.md), and the logits are bitwise the same (tests/test_narrow_weights.py). With f32
math the plugin widens the marked weights in every call instead: at Qwen3-4B's width calls of 1 to 4 rows ran 1.2x-1.9x
as fast, but 5 to 32 rows (verification) 0.6x-0.8x. So under f32 math they stay widened, unless four times their
stored bytes would take more than half the machine's memory: a target that would not fit then runs, slower to verify
(a bf16 Qwen3-4B: 7.8 GB added where widened it would take about 30 GB). Its logits then differ from the widened
weights' (NMSE 6e-9), and its rows still compute bitwise alike in any call (tests/test_static_rows.py).
f16 weights under bf16 math are not marked: their logits came out rounded otherwise.

The mark is set when compiling, not in the IR: the IR format keeps only the C++ attribute, which Python cannot set.
"""

from __future__ import annotations

import openvino as ov

from ovbuild.runtime.model.machine import cpu_math, device_kind, physical_memory_mb

# The rt_info key of OpenVINO's Decompression attribute (ov::mark_as_decompression): the plugin looks for the key only.
DECOMPRESSION = "decompression_0"
MATH_TYPES = {"bf16": ov.Type.bf16, "f16": ov.Type.f16}
NARROW_FLOATS = (ov.Type.bf16, ov.Type.f16)
WIDENED = 4  # memory per stored byte of a bf16 or f16 matrix the plugin widens (its f32 fold and repacked f32 copy)
MEMORY_SHARE = 0.5  # widened weights may take at most this share of physical memory


def weight_converts(model: ov.Model, stored: tuple[ov.Type, ...]) -> list[ov.Node]:
    """The Converts that widen a Constant stored in one of the `stored` types to f32."""
    return [
        node
        for node in model.get_ops()
        if node.get_type_name() == "Convert"
        and node.get_output_element_type(0) == ov.Type.f32
        and node.input_value(0).get_node().get_type_name() == "Constant"
        and node.get_input_element_type(0) in stored
    ]


def stored_bytes(converts: list[ov.Node]) -> int:
    """Bytes of the Constants the Converts widen."""
    return sum(node.input_value(0).get_node().get_byte_size() for node in converts)


def narrow_types(device: str, inference_precision: str | None, narrow_bytes: int = 0) -> tuple[ov.Type, ...]:
    """The stored precisions whose weights a model compiled on `device` with this INFERENCE_PRECISION_HINT keeps
    narrow (CPU only): the math precision when it is bf16 or f16; under f32 math, bf16 and f16 when `narrow_bytes` of
    them widened would take more than MEMORY_SHARE of physical memory; else none."""
    if device_kind(device) != "CPU":
        return ()
    math = cpu_math(inference_precision)
    if math in MATH_TYPES:
        return (MATH_TYPES[math],)
    memory = physical_memory_mb()
    too_big = memory is not None and WIDENED * narrow_bytes > MEMORY_SHARE * memory * 2**20
    return NARROW_FLOATS if too_big else ()


def narrow_weights(model: ov.Model, device: str, inference_precision: str | None) -> ov.Model:
    """The model with the Converts of its weights kept narrow (narrow_types) marked as decompression (a copy: callers
    compile one model many ways); else the model itself."""
    stored = narrow_types(device, inference_precision, stored_bytes(weight_converts(model, NARROW_FLOATS)))
    if not stored or not weight_converts(model, stored):
        return model
    copy = model.clone()
    for node in weight_converts(copy, stored):
        node.get_rt_info()[DECOMPRESSION] = ""
    return copy

"""Float weights kept in their stored precision by the CPU plugin, where it computes in that same precision.

A bf16 or f16 checkpoint matrix is stored so in the IR and widened to f32 by a Convert after its Constant
(ovbuild.graph.weights.stored_constant). The CPU plugin folds an unmarked Convert: it keeps an f32 copy of every such
matrix beside the repacked one it computes with, 4x the stored bytes in all. A Convert marked as weight decompression
(OpenVINO's own mark, which its converters set on compressed float weights) is not folded: the plugin repacks the
stored matrix itself. With bf16 math that halved the demo target's memory (its copies and sibling: 533 MB against
1057 MB), four layers of Qwen3-4B's width peaked at 3.7 GB against 6.7 GB, calls ran as fast (0.98x-1.03x;
bench/bench_narrow_weights.py), and the logits are bitwise the same (tests/test_narrow_weights.py). With f32 math
the plugin would widen the marked weights in every call instead, and a call of 8 to 32 rows ran at 0.6x-0.8x at
Qwen3-4B's width; and f16 weights under bf16 math were computed otherwise (logits rounded to bf16): only weights
stored in the math precision are marked.

The mark is set when compiling, not in the IR: the IR format keeps only the C++ attribute, which Python cannot set.
"""

from __future__ import annotations

import openvino as ov

from ovbuild.graph.ir import core
from ovbuild.runtime.machine import cpu_runtime_precision

# The rt_info key of OpenVINO's Decompression attribute (ov::mark_as_decompression): the plugin looks for the key only.
DECOMPRESSION = "decompression_0"
MATH_TYPES = {"bf16": ov.Type.bf16, "f16": ov.Type.f16}


def weight_converts(model: ov.Model, stored: ov.Type) -> list[ov.Node]:
    """The Converts that widen a Constant stored in `stored` to f32."""
    return [
        node
        for node in model.get_ops()
        if node.get_type_name() == "Convert"
        and node.get_output_element_type(0) == ov.Type.f32
        and node.input_value(0).get_node().get_type_name() == "Constant"
        and node.get_input_element_type(0) == stored
    ]


def narrow_type(device: str, inference_precision: str | None) -> ov.Type | None:
    """The precision a model compiled on `device` with this INFERENCE_PRECISION_HINT computes in, when that is bf16
    or f16 (CPU only); else None."""
    if not device.upper().startswith("CPU"):
        return None
    capabilities = core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")
    return MATH_TYPES.get(cpu_runtime_precision(capabilities, inference_precision))


def narrow_weights(model: ov.Model, device: str, inference_precision: str | None) -> ov.Model:
    """The model with the Converts of its weights stored in the math precision marked as decompression (a copy:
    callers compile one model many ways); else the model itself."""
    stored = narrow_type(device, inference_precision)
    if stored is None or not weight_converts(model, stored):
        return model
    copy = model.clone()
    for node in weight_converts(copy, stored):
        node.get_rt_info()[DECOMPRESSION] = ""
    return copy

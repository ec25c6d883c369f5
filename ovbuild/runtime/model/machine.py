"""What this CPU offers OpenVINO: instruction-set extensions and the plugin's own capabilities.

Benchmarks print it beside their figures, and tests use it where the CPU plugin's behaviour depends on the hardware
(for example, int8 activation quantization of compressed layers needs VNNI or AMX; bf16 inference needs bf16 units).
"""

from __future__ import annotations

import functools
import os
import platform
from pathlib import Path

# The flags that change which kernels OpenVINO's CPU plugin picks, in /proc/cpuinfo's spelling.
FEATURES = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_int8")


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (empty where /proc/cpuinfo is not readable). Rules call it as machine.cpu_flags(), so
    that a test can stand in another CPU's flags."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def has_int8_dot_product() -> bool:
    """Whether the CPU has int8 dot-product units (VNNI or AMX), which dynamic activation quantization needs."""
    return bool(cpu_flags() & {"avx512_vnni", "avx_vnni", "amx_int8"})


def cpu_capabilities() -> list[str]:
    """The CPU plugin's OPTIMIZATION_CAPABILITIES (FP32, BF16, FP16, INT8, ...): what its kernels can compute in.
    Every rule that depends on them reads them here (as machine.cpu_capabilities(), or through cpu_math), so that a
    test can put the rule on another CPU's terms."""
    from ovbuild.ir import core

    return list(core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"))


def cpu_math(inference_precision: str | None) -> str:
    """What the CPU plugin computes in on this CPU with this INFERENCE_PRECISION_HINT (None: its default)."""
    return cpu_runtime_precision(cpu_capabilities(), inference_precision)


def cpu_runtime_precision(capabilities: list[str], inference_precision: str | None) -> str:
    """What the CPU plugin computes in: the hint when the CPU has units for it, else bf16 when it has bf16 units
    (its default and its stand-in for an f16 hint without f16 units), else f32."""
    if inference_precision == "f32":
        return "f32"
    if inference_precision == "f16" and "FP16" in capabilities:
        return "f16"
    return "bf16" if "BF16" in capabilities else "f32"


def describe() -> str:
    """One line: CPU model, its kernel-relevant flags, and the CPU plugin's capabilities and default precision."""
    from ovbuild.ir import core

    flags = [f for f in FEATURES if f in cpu_flags()]
    caps = cpu_capabilities()
    precision = core().get_property("CPU", "INFERENCE_PRECISION_HINT").get_type_name()
    name = core().get_property("CPU", "FULL_DEVICE_NAME") or platform.processor()
    have = " ".join(flags) or "none of " + " ".join(FEATURES)
    return f"{name}; flags: {have}; plugin: {','.join(caps)}, default {precision}"


def device_kind(device: str) -> str:
    """The kind of an OpenVINO device name, upper case and without its index: "GPU" for "gpu.1", "CPU" for "CPU"."""
    return device.upper().split(".", 1)[0]


def physical_memory_mb() -> float | None:
    """Installed memory in MB, or None where the OS does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20
    except (AttributeError, ValueError, OSError):
        return None

"""What this CPU offers OpenVINO: instruction-set extensions and the plugin's own capabilities.

Benchmarks print it beside their figures, and tests use it where the CPU plugin's behaviour depends on the hardware
(for example, int8 activation quantization of compressed layers needs VNNI or AMX; bf16 inference needs bf16 units).
Under oneDNN's ISA limit (ONEDNN_MAX_CPU_ISA) the CPU answers as one without the extensions above the limit would:
set to AVX2 on a CPU with AVX-512, it stands in for an AVX2-only CPU.
"""

from __future__ import annotations

import functools
import os
import platform
from pathlib import Path

# The flags that change which kernels OpenVINO's CPU plugin picks, in /proc/cpuinfo's spelling.
FEATURES = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_int8")

# oneDNN's ISA limit, and the extensions each level of it keeps: oneDNN, whose kernels run the matmuls, runs none
# above the limit, so a rule reading the flags must not count on them either. Levels are oneDNN's names (its docs:
# "CPU Dispatcher Control") and nest as its ISAs do: AVX512_CORE holds AVX2 but not AVX2_VNNI; below AVX512_CORE every
# avx512 flag goes.
ISA_ENV = "ONEDNN_MAX_CPU_ISA"
GATED = (*FEATURES, "amx_fp16")
_CORE = ("avx2", "avx512f")
_BF16 = (*_CORE, "avx512_vnni", "avx512_bf16")
_FP16 = (*_BF16, "avx512_fp16", "avx_vnni")
ISA_KEEPS: dict[str, tuple[str, ...]] = {
    "SSE41": (),
    "AVX": (),
    "AVX2": ("avx2",),
    "AVX2_VNNI": ("avx2", "avx_vnni"),
    "AVX2_VNNI_2": ("avx2", "avx_vnni"),
    "AVX512_CORE": _CORE,
    "AVX512_CORE_VNNI": (*_CORE, "avx512_vnni"),
    "AVX512_CORE_BF16": _BF16,
    "AVX512_CORE_FP16": _FP16,
    "AVX10_1_512": _FP16,
    "AVX512_CORE_AMX": (*_BF16, "amx_bf16", "amx_int8"),
    "AVX10_1_512_AMX": (*_FP16, "amx_bf16", "amx_int8"),
}


@functools.cache
def isa_limit() -> str | None:
    """oneDNN's ISA limit where one is set and known, else None: read once, as oneDNN reads it (at its first kernel;
    the process keeps that limit whatever the variable says later)."""
    return isa_level(os.environ.get(ISA_ENV, ""))


def isa_level(value: str) -> str | None:
    """The level of ISA_KEEPS a value of ONEDNN_MAX_CPU_ISA names (case and blanks aside), or None."""
    name = value.strip().upper()
    return name if name in ISA_KEEPS else None


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (empty where /proc/cpuinfo is not readable), less those above oneDNN's ISA limit. Rules
    call it as machine.cpu_flags(), so that a test can stand in another CPU's flags."""
    return limited(proc_cpu_flags(), isa_limit())


@functools.cache
def proc_cpu_flags() -> frozenset[str]:
    """The flags /proc/cpuinfo lists for the CPU (empty where it is not readable)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def limited(flags: frozenset[str], limit: str | None) -> frozenset[str]:
    """`flags` as a CPU limited to `limit` (a level of ISA_KEEPS; None: no limit) offers them."""
    if limit is None:
        return flags
    keeps = ISA_KEEPS[limit]
    dropped = {f for f in flags if f in GATED and f not in keeps}
    if "avx512f" not in keeps:
        dropped |= {f for f in flags if f.startswith("avx512")}
    return flags - dropped


def has_int8_dot_product() -> bool:
    """Whether the CPU has int8 dot-product units (VNNI or AMX), which dynamic activation quantization needs."""
    return bool(cpu_flags() & {"avx512_vnni", "avx_vnni", "amx_int8"})


def cpu_capabilities() -> list[str]:
    """The CPU plugin's OPTIMIZATION_CAPABILITIES (FP32, BF16, FP16, INT8, ...): what its kernels can compute in.
    Every rule that depends on them reads them here (as machine.cpu_capabilities(), or through cpu_math), so that a
    test can put the rule on another CPU's terms."""
    from ovbuild.ir import core

    capabilities = list(core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"))
    if isa_limit() is None:
        return capabilities
    # the plugin reads these two from the CPU itself, past the limit; its bf16 and f16 kernels are oneDNN's, within it
    flags = cpu_flags()
    units = {"BF16": {"avx512_bf16", "amx_bf16"}, "FP16": {"avx512_fp16", "amx_fp16"}}
    return [c for c in capabilities if c not in units or units[c] & flags]


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
    limit = f" (oneDNN limited to {isa_limit()}: {ISA_ENV})" if isa_limit() else ""
    return f"{name}; flags: {have}{limit}; plugin: {','.join(caps)}, default {precision}"


def device_kind(device: str) -> str:
    """The kind of an OpenVINO device name, upper case and without its index: "GPU" for "gpu.1", "CPU" for "CPU"."""
    return device.upper().split(".", 1)[0]


def physical_memory_mb() -> float | None:
    """Installed memory in MB, or None where the OS does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20
    except (AttributeError, ValueError, OSError):
        return None

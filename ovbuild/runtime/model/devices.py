"""Which devices OpenVINO sees, and which KV cache precisions a device runs: checked before compiling anything."""

from __future__ import annotations

from ovbuild.errors import ConfigError, UnsupportedError
from ovbuild.ir import core
from ovbuild.runtime.model import machine
from ovbuild.runtime.model.machine import cpu_runtime_precision, device_kind
from ovbuild.runtime.model.paged_model import KV_PRECISIONS

VIRTUAL_DEVICES = ("AUTO", "MULTI", "HETERO", "BATCH")  # take real devices after a colon: "AUTO:GPU,CPU"


def check_device(device: str) -> None:
    """Raise ConfigError unless every real device named in `device` is one OpenVINO lists (or its family, "GPU")."""
    available = core().available_devices
    name, _, members = device.partition(":")
    names = [m.split("(")[0].strip() for m in members.split(",")] if name.upper() in VIRTUAL_DEVICES else [device]
    known = set(available) | {d.split(".")[0] for d in available}
    for n in names:
        if n not in known:
            raise ConfigError(f"unknown device '{n}' (available: {', '.join(available)})")


def kv_precisions(device: str, inference_precision: str | None) -> tuple[str, ...]:
    """KV cache precisions that compile on `device` at `inference_precision` (None = the device's default)."""
    if device_kind(device) != "CPU":
        return KV_PRECISIONS  # other plugins are left to judge at compile time
    return cpu_kv_precisions(machine.cpu_capabilities(), inference_precision)


def cpu_kv_precisions(capabilities: list[str], inference_precision: str | None) -> tuple[str, ...]:
    """The CPU plugin's PagedAttention stores u8 and f16 caches at any runtime precision, but a bf16 cache only when
    it computes in bf16 and an f32 cache only when it computes in f32 (measured on 2026.4: "expect kvcache type")."""
    runtime = cpu_runtime_precision(capabilities, inference_precision)
    return tuple(p for p in KV_PRECISIONS if p in ("u8", "f16") or p == runtime)


def check_kv_precision(device: str, kv_cache_precision: str, inference_precision: str | None, name: str) -> None:
    """Raise UnsupportedError naming the choices unless `device` runs a `kv_cache_precision` cache."""
    if kv_cache_precision not in KV_PRECISIONS:
        raise UnsupportedError(f"{name} '{kv_cache_precision}' is not one of {', '.join(KV_PRECISIONS)}")
    if inference_precision is None and kv_cache_precision == "f32":
        inference_precision = "f32"  # compile_config asks for f32 math with an f32 cache
    choices = kv_precisions(device, inference_precision)
    if kv_cache_precision not in choices:
        at = f"inference precision {inference_precision}" if inference_precision else "its default inference precision"
        raise UnsupportedError(
            f"{name} '{kv_cache_precision}' does not run on {device} at {at} (choices: {', '.join(choices)})"
        )


def target_inference_precision(
    device: str, requested: str | None, kv_cache_precision: str, stateful: bool = False
) -> str | None:
    """The inference precision a target compiles with: the one requested; else bf16 on a CPU with AVX-512 bf16 units
    and no AMX, for a target without linear-attention states (`stateful`); else f32 (None, the device's default, with
    a bf16 cache, which only bf16 math stores).

    Exactness decides. With verification rows as 1-row subsequences (PagedModel.row_subsequences) and taps in the
    math precision (taps_in_math_precision), every row of a speculative step is computed as the target alone computes
    it: with bf16 math 32 of 32 requests were identical to the target alone at K = 3, 7 and adaptive, with f16 and u8
    caches (bench/bench_kv_cache.py), and the demo target ran 1.02-1.24x faster per call than in f32 and 1.23-1.37x
    faster served (bench_target_precision.py, docs/speed.md; 1.5-1.7x at Qwen3-4B's shape with bf16 weights from 4 rows
    on, the same with int8 weights). Where the matrix units are AMX, a row may round differently with the number of
    rows in its call, which is not measured: f32 stays there, as on CPUs without bf16 units and on other devices. A
    hybrid target steps its states through a sequence's rows in one subsequence, so its rows round by their count."""
    if requested is not None:
        return requested
    if kv_cache_precision == "bf16":
        return None
    flags = machine.cpu_flags()
    on_cpu = device_kind(device) == "CPU"
    if on_cpu and not stateful and kv_cache_precision != "f32" and "avx512_bf16" in flags and "amx_bf16" not in flags:
        return "bf16"
    return "f32"


def draft_inference_precision(device: str, requested: str | None, kv_cache_precision: str) -> str | None:
    """The inference precision a draft compiles with: the one requested; else f32 on a CPU without AMX (unless its
    cache is bf16, which needs bf16 math); else the device's default (None).

    A draft's calls are a few rows through a few layers: on a CPU whose bf16 is AVX-512 without AMX, the plugin's
    default bf16 math spends more on reorders between f32 and bf16 than it saves. The demo draft in speculative steps
    took 1.00-1.21x longer per step in bf16 than in f32 over five runs (bench_draft_precision.py, docs/speed.md,
    and one-offs before it) and proposed the same tokens; a draft shaped like z-lab/Qwen3-4B-DFlash-b16 (int8
    weights, its calls bound by the 151936-row lm_head) took the same in both (1.00-1.03x). AMX's bf16 matrix units
    are another matter: there the default stays."""
    if requested is not None or device_kind(device) != "CPU" or kv_cache_precision == "bf16":
        return requested
    return None if "amx_bf16" in machine.cpu_flags() else "f32"

"""oneDNN's ISA limit (ONEDNN_MAX_CPU_ISA) as a stand-in for an older CPU: the rules read the CPU as the limit leaves
it, and a pair exported with int8 weights serves under it, losslessly."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ovbuild.runtime.model import machine
from ovbuild.runtime.model.devices import draft_inference_precision, target_inference_precision
from ovbuild.runtime.model.paged_model import compile_config

AVX512_VNNI_BF16 = frozenset(
    {"sse4_2", "f16c", "avx2", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "avx512_bf16"}
)


@pytest.fixture
def avx512_cpu(monkeypatch):
    """This test's CPU: AVX-512 with VNNI and bf16 units, no AMX (the flags /proc/cpuinfo would list)."""
    monkeypatch.setattr(machine, "proc_cpu_flags", lambda: AVX512_VNNI_BF16)


def test_a_limit_drops_the_extensions_above_it():
    """Each level keeps the extensions at or below it and every flag no level governs (sse4_2, f16c)."""
    assert machine.limited(AVX512_VNNI_BF16, "AVX2") == {"sse4_2", "f16c", "avx2"}
    assert machine.limited(AVX512_VNNI_BF16, "AVX2_VNNI") == {"sse4_2", "f16c", "avx2", "avx_vnni"}
    assert machine.limited(AVX512_VNNI_BF16, "AVX512_CORE") == {"sse4_2", "f16c", "avx2", "avx512f", "avx512bw"}
    no_avx_vnni = AVX512_VNNI_BF16 - {"avx_vnni"}  # AVX2_VNNI is not below AVX512_CORE in oneDNN's nesting
    assert machine.limited(AVX512_VNNI_BF16, "AVX512_CORE_BF16") == no_avx_vnni
    amx = AVX512_VNNI_BF16 | {"amx_bf16"}
    assert machine.limited(amx, "AVX512_CORE_AMX") == no_avx_vnni | {"amx_bf16"}
    assert machine.limited(amx, "AVX10_1_512_AMX") == amx
    assert machine.limited(AVX512_VNNI_BF16, None) == AVX512_VNNI_BF16


@pytest.mark.parametrize(
    ("value", "limit"), [("avx2", "AVX2"), (" AVX512_CORE ", "AVX512_CORE"), ("ALL", None), ("", None)]
)
def test_the_limit_is_read_as_onednn_reads_it(value, limit):
    """Case and blanks do not matter; a level the table does not know (ALL, DEFAULT, a typo) limits nothing here. (The
    variable itself is set only in a process of its own: oneDNN latches it at its first kernel.)"""
    assert machine.isa_level(value) == limit


def test_rules_read_the_cpu_as_the_limit_leaves_it(avx512_cpu, monkeypatch):
    """Under an AVX2 limit the target computes in f32 (no bf16 units left), bf16 is not a capability, a model left to
    the plugin's math is asked for f32, and compressed layers quantize no activations (no VNNI left); without the
    limit the same CPU keeps all of them."""
    monkeypatch.setattr(machine, "isa_limit", lambda: None)
    assert target_inference_precision("CPU", None, "f16") == "bf16"
    assert "DYNAMIC_QUANTIZATION_GROUP_SIZE" not in compile_config("f16", "f32")
    assert "INFERENCE_PRECISION_HINT" not in compile_config("u8", None)
    monkeypatch.setattr(machine, "isa_limit", lambda: "AVX2")
    assert machine.cpu_flags() & set(machine.GATED) == {"avx2"}
    assert target_inference_precision("CPU", None, "f16") == "f32"
    assert draft_inference_precision("CPU", None, "u8") == "f32"
    assert compile_config("f16", "f32")["DYNAMIC_QUANTIZATION_GROUP_SIZE"] == "0"
    assert compile_config("u8", None)["INFERENCE_PRECISION_HINT"] == "f32"  # not the plugin's default, bf16
    assert "DYNAMIC_QUANTIZATION_GROUP_SIZE" not in compile_config("f16", "f32", device="GPU")
    assert "BF16" not in machine.cpu_capabilities()
    assert "(oneDNN limited to AVX2" in machine.describe()


SERVE_UNDER_THE_LIMIT = """
import json, sys
from ovbuild.runtime.model.machine import describe
from ovbuild.runtime.pipeline import Pipeline
target, draft = sys.argv[1:3]
prompts = [[1, 2, 3, 4, 5], [7, 3, 9, 11, 2, 4, 8]]
speculative = Pipeline(target, draft)
alone = Pipeline(target, None)
print(json.dumps({
    "describe": describe(),
    "group": str(speculative.target.compiled.get_property("DYNAMIC_QUANTIZATION_GROUP_SIZE")),
    "speculative": [r.generated for r in speculative.generate(prompts, 12)[0]],
    "alone": [r.generated for r in alone.generate(prompts, 12)[0]],
}))
"""


def test_an_int8_pair_serves_losslessly_under_an_avx2_limit(tiny_pair, tmp_path):
    """In its own process (oneDNN reads the limit once): the tiny pair's int8 layers compile and run where, left to
    the plugin, they failed on their first call, and greedy output with the draft equals the target alone's."""
    env = {**os.environ, machine.ISA_ENV: "AVX2", "XDG_CACHE_HOME": str(tmp_path)}
    script = tmp_path / "serve.py"
    script.write_text(SERVE_UNDER_THE_LIMIT)
    done = subprocess.run(
        [sys.executable, str(script), *map(str, tiny_pair)], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert "oneDNN limited to AVX2" in out["describe"] and out["group"] == "0", out
    assert out["speculative"] == out["alone"] and all(len(g) == 12 for g in out["alone"]), out

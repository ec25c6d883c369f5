"""The MoE MLP's routing designs side by side (graph/moe.py): one Qwen3.5-35B-A3B-style layer, compressed experts.

Shape: 256 experts, 8 per token, as Qwen3.5-35B-A3B; hidden 2048 -> 1024 and expert width 512 -> 256 so that both
designs' weights fit beside other work on a small machine (a layer's experts: 201 M weights); the shared expert
has the expert width. Row counts: packed decode (1 and 4 sequences x 1 row) and verification (1 x 16, 4 x 5 rows),
and a 128-row prefill chunk. f32 math, the IR's own weight format (int8 per channel, or int4 in groups of 128).
Median ms of interleaved rounds (every design and row count once per round), so a busy moment of a shared machine
hits all of them.

    python bench/bench_moe.py [--weight-format int8|int4] [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import openvino as ov
from openvino import opset16

from ovbuild.graph.context import BuildContext
from ovbuild.graph.moe import MOE_DESIGNS, moe_mlp
from ovbuild.graph.ops import result
from ovbuild.graph.weights import WeightPolicy
from ovbuild.runtime.machine import describe
from ovbuild.testing.tiny_hybrid import hybrid_layer_shapes
from ovbuild.weights.checkpoint import Checkpoint
from ovbuild.weights.moe import MoeSpec, moe_tensor_table
from ovbuild.weights.tensor_names import WeightSource

from shapes import QWEN36_SCALED, QWEN36_SCALED_DFLASH, write_config, write_part

SPEC = MoeSpec(num_experts=256, top_k=8, expert_intermediate_size=256, shared_intermediate_size=256)
HIDDEN = 1024
# A whole target for bench_cost_model.py: Qwen3.5-35B-A3B (40 layers LLLF, hidden 2048, 16 / 2 attention heads of
# 256, linear attention 16 key / 32 value heads of 128, 256 experts of 512, 8 per token, shared expert 512,
# vocabulary 248320) scaled as this layer: hidden 1024, experts of 256, 4 layers LLLF, heads halved at the same
# widths; the vocabulary kept.
QWEN35_MOE_SCALED = {
    **{k: v for k, v in QWEN36_SCALED.items() if k != "intermediate_size"},
    "architectures": ["Qwen3_5MoeForCausalLM"],
    "model_type": "qwen3_5_moe_text",
    "hidden_size": HIDDEN,
    "num_hidden_layers": 4,
    "layer_types": ["linear_attention"] * 3 + ["full_attention"],
    "num_attention_heads": 8,
    "num_key_value_heads": 1,
    "linear_num_key_heads": 8,
    "linear_num_value_heads": 16,
    "num_experts": SPEC.num_experts,
    "num_experts_per_tok": SPEC.top_k,
    "moe_intermediate_size": SPEC.expert_intermediate_size,
    "shared_expert_intermediate_size": SPEC.shared_intermediate_size,
}
QWEN35_MOE_SCALED_DFLASH = {
    **QWEN36_SCALED_DFLASH,
    "hidden_size": HIDDEN,
    "intermediate_size": 3072,
    "num_target_layers": 4,
    "dflash_config": {**QWEN36_SCALED_DFLASH["dflash_config"], "target_layer_ids": [0, 1, 2, 3]},
}
ROWS = {"decode 1 x 1": 1, "decode 4 x 1": 4, "verify 1 x 16": 16, "verify 4 x 5": 20, "prefill 1 x 128": 128}


def moe_shapes(p: str) -> dict[str, tuple[int, ...]]:
    """The MoE MLP's tensor shapes under prefix `p` (`...layers.N.mlp.`), fused experts."""
    e, inter, s, h = SPEC.num_experts, SPEC.expert_intermediate_size, SPEC.shared_intermediate_size, HIDDEN
    return {
        f"{p}gate.weight": (e, h),
        f"{p}shared_expert_gate.weight": (1, h),
        f"{p}shared_expert.gate_proj.weight": (s, h),
        f"{p}shared_expert.up_proj.weight": (s, h),
        f"{p}shared_expert.down_proj.weight": (h, s),
        f"{p}experts.gate_up_proj": (e, 2 * inter, h),
        f"{p}experts.down_proj": (e, h, inter),
    }


def write_layer(folder: Path) -> WeightSource:
    """A random bf16 checkpoint of one MoE layer (layer 0) in the fused layout."""
    write_config(folder, {})
    write_part(folder, "layer-0", moe_shapes("model.language_model.layers.0.mlp."), np.random.default_rng(0))
    return WeightSource(Checkpoint.open(folder), moe_tensor_table("model.language_model.", SPEC.num_experts))


def write_moe_target(folder: Path, config: dict = QWEN35_MOE_SCALED, seed: int = 0) -> Path:
    """A random text-only Qwen3.5 MoE target (flat config, tensors under `model.`), one file per layer."""
    rng = np.random.default_rng(seed)
    write_config(folder, config)
    table = (config["vocab_size"], config["hidden_size"])
    write_part(folder, "tables", {"model.embed_tokens.weight": table, "model.norm.weight": table[1:]}, rng)
    write_part(folder, "lm_head", {"lm_head.weight": table}, rng)
    for i, layer_type in enumerate(config["layer_types"]):
        dense = {
            f"model.layers.{i}.{n}": s
            for n, s in hybrid_layer_shapes(config | {"intermediate_size": 1}, layer_type).items()
        }
        shapes = {n: s for n, s in dense.items() if ".mlp." not in n} | moe_shapes(f"model.layers.{i}.mlp.")
        write_part(folder, f"layer-{i}", shapes, rng)
    return folder


def compile_design(weights: WeightSource, design: str, policy: WeightPolicy) -> ov.CompiledModel:
    x = opset16.parameter([-1, HIDDEN], ov.Type.f32, name="x")  # [T, H]: a bare layer, no IR port
    ctx = BuildContext(SimpleNamespace(hidden_size=HIDDEN), weights, policy, None, None)
    model = ov.Model([result(moe_mlp(ctx, 0, x.output(0), SPEC, design), "y")], [x], f"moe_{design}")
    return ov.Core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--weight-format", default="int8", choices=["int8", "int4"])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    print(describe(), flush=True)
    policy = WeightPolicy(args.weight_format, sym=False, group_size=128)
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        weights = write_layer(Path(tmp))
        compiled = {d: compile_design(weights, d, policy) for d in MOE_DESIGNS}
        print(f"layer written, built and compiled in {time.perf_counter() - start:.0f} s", flush=True)
        rng = np.random.default_rng(1)
        inputs = {name: rng.standard_normal((rows, HIDDEN)).astype(np.float32) for name, rows in ROWS.items()}
        requests = {d: c.create_infer_request() for d, c in compiled.items()}
        times: dict[tuple[str, str], list[float]] = {}
        for r in range(args.rounds + 1):  # round 0 warms every shape up
            for name, x in inputs.items():
                for design, request in requests.items():
                    begin = time.perf_counter()
                    request.infer([x])
                    if r:
                        times.setdefault((name, design), []).append(time.perf_counter() - begin)
        agree = max(
            float(np.abs(requests["dense"].infer([x])[0] - requests["gather"].infer([x])[0]).max())
            for x in inputs.values()
        )
    print(
        f"\n{args.weight_format} experts; median ms over {args.rounds} rounds; designs agree to {agree:.1e} (max abs)"
    )
    print(f"{'rows':<18}" + "".join(f"{d:>10}" for d in MOE_DESIGNS) + f"{'dense / gather':>16}")
    for name in ROWS:
        med = {d: statistics.median(times[(name, d)]) * 1e3 for d in MOE_DESIGNS}
        print(
            f"{name:<18}" + "".join(f"{med[d]:>10.2f}" for d in MOE_DESIGNS) + f"{med['dense'] / med['gather']:>16.2f}"
        )


if __name__ == "__main__":
    main()

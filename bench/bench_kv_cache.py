"""Which target KV cache is exact and which is fastest, on the shipped demo pair, side by side in one process.

Exact here means what speculative decoding needs: with the same cache configuration, the speculative output equals
the target alone token for token. Each configuration serves 32 code prompts (96 new tokens) alone, then with a draft
steered to propose the target's own continuation with a wrong token at a random position (so that every step writes
rows that are then rolled back), at K = 3, 7 and the adaptive choice. With bf16 math, verification rows run as one
k-row subsequence per request too (what ovbuild did before it verified on CPU in 1-row subsequences) against a 1-row
subsequence per row (what it does on CPU). Then it times one decode call, one row per sequence, at several context
lengths: each case the best quartile of 30 calls, the configurations interleaved in rounds (bench/harness.py), their
time against f32's taken within rounds.

    python bench/bench_kv_cache.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from ovbuild.demo import export_pair, shipped_pair
from ovbuild.ir import read_ir
from ovbuild.runtime.cache.kv_cache import SequenceRows
from ovbuild.runtime.model.paged_model import PagedModel
from ovbuild.runtime.pipeline import Pipeline
from ovbuild.runtime.request import GenerationConfig
from ovbuild.runtime.scheduler import Scheduler
from ovbuild.runtime.speculation.drafters import BlockDrafter
from ovbuild.testing.steered import SteeredDrafter

sys.path.insert(0, str(Path(__file__).parent))
import harness
from bench_vs_genai import PROMPTS

# name: (KV_CACHE_PRECISION, inference precision, extra plugin properties, verification rows as 1-row subsequences);
# ovbuild's u8 is per-token keys, the plugin's default per channel
CONFIGS = {
    "f32": ("f32", "f32", {}, True),
    "f16": ("f16", "f32", {}, True),
    "u8, keys per channel (plugin default)": ("u8", "f32", {"KEY_CACHE_QUANT_MODE": "BY_CHANNEL"}, True),
    "u8, keys per token (ovbuild's u8)": ("u8", "f32", {}, True),
    "bf16 math, f16, k-row subsequences": ("f16", "bf16", {}, False),
    "bf16 math, f16": ("f16", "bf16", {}, True),
    "bf16 math, u8 per token, k-row subsequences": ("u8", "bf16", {}, False),
    "bf16 math, u8 per token": ("u8", "bf16", {}, True),
}
TIMED = (
    "f32",
    "f16",
    "u8, keys per channel (plugin default)",
    "u8, keys per token (ovbuild's u8)",
    "bf16 math, f16",
    "bf16 math, u8 per token",
)
LABELS = dict(zip(TIMED, ("f32", "f16", "u8/channel", "u8/token", "bf16+f16", "bf16+u8"), strict=True))


def compiled_target(model, config: tuple, blocks: int) -> PagedModel:
    """The target compiled as `config` says (a CONFIGS value)."""
    kv, math, extra, row_subsequences = config
    target = PagedModel(model, kv_cache_precision=kv, inference_precision=math, num_blocks=blocks, properties=extra)
    target.row_subsequences &= row_subsequences
    return target


def exactness(model, draft_model, prompts, config: tuple) -> dict:
    alone = Scheduler(compiled_target(model, config, 512))
    requests = [alone.add_request(p, GenerationConfig(96)) for p in prompts]
    alone.run()
    expected = [r.generated for r in requests]
    same = {}
    for k in (3, 7, None):
        label = "adaptive" if k is None else f"K={k}"
        drafter = SteeredDrafter(BlockDrafter(draft_model, num_blocks=512), 1 << 20, seed=k or 0)
        scheduler = Scheduler(compiled_target(model, config, 512), drafter)
        spec = [scheduler.add_request(p, GenerationConfig(96, num_assistant_tokens=k)) for p in prompts]
        for request, tokens in zip(spec, expected, strict=True):
            drafter.truths[request.id] = [*request.prompt.tolist(), *tokens]
        try:
            scheduler.run()
            same[label] = sum(r.generated == e for r, e in zip(spec, expected, strict=True))
        except AssertionError:  # the steered draft saw an anchor the target alone never produced
            same[label] = "diverged"
    return same


def decode_ms(target: PagedModel, seqs: int, past: int, rounds: int = 30) -> float:
    rows = [SequenceRows(i, past, 1) for i in range(seqs)]
    for i in range(seqs):
        target.cache.allocator.reserve(i, past + 1)
    inputs = {
        "input_ids": np.full(seqs, 5, np.int64),
        "position_ids": np.full(seqs, past, np.int64),
        "logits_indices": np.arange(seqs),
    }
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        target.run(rows, inputs)
        times.append(time.perf_counter() - start)
    for i in range(seqs):
        target.free(i)
    return float(np.percentile(times, 25) * 1e3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    harness.add_arguments(parser, rounds=3)
    args = parser.parse_args()
    harness.start("Which target KV cache is exact and which is fastest, on the shipped demo pair")
    with tempfile.TemporaryDirectory(prefix="ovbuild_kv_") as tmp:
        target_dir, draft_dir = export_pair(*shipped_pair(), Path(tmp))
        model, draft_model = read_ir(target_dir), read_ir(draft_dir)
        prompts = [Pipeline(target_dir).encode(p) for p in PROMPTS]
        print("exactness: 32 prompts x 96 tokens, speculative (steered draft) vs the target alone, same configuration")
        for name, config in CONFIGS.items():
            print(f"  {name:<44} identical requests: {exactness(model, draft_model, prompts, config)}")
        targets = {name: compiled_target(model, CONFIGS[name], 1100) for name in TIMED}
        print(f"decode call, one row per sequence (ms, best quartile of 30 calls; median of {args.rounds} rounds,")
        print("configurations interleaved; in brackets this configuration's time / f32's within rounds, median):")
        for seqs, past in ((1, 100), (1, 2000), (1, 4000), (8, 2000), (16, 2000)):
            cases = {
                name: lambda t=t: harness.Measured(decode_ms(t, seqs, past) / 1e3)  # noqa: B023 (called in the loop)
                for name, t in targets.items()
            }
            rounds = harness.interleave(cases, args.rounds, seed=args.seed + seqs + past)
            cells = "  ".join(
                f"{LABELS[name]} {rounds.median(name) * 1e3:.2f} ({rounds.ratio(name, 'f32').median:.2f}x)"
                for name in TIMED
            )
            print(f"  {seqs:>2} seq x {past:>4} context: {cells}")


if __name__ == "__main__":
    main()

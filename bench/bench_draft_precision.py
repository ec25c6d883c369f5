"""Which inference precision the demo draft runs fastest in, as speculative decoding runs it (each draft call right
after a target call): the device's default (bf16 where the CPU has bf16 units) against f32, one request at a time at
pinned draft lengths, the target the same exact f32 model on both sides. Side by side in one process, interleaved
rounds in a new order each round; draft time and wall time per step (medians), ratios within rounds, the mean
acceptance length of each and a check that both generate the same tokens.

    python bench/bench_draft_precision.py [--rounds 7] [--k 3 5] [--prompts 16]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
from pathlib import Path

from ovbuild.runtime.machine import describe
from ovbuild.runtime.pipeline import EXACT_TARGET, FAST_DRAFT, ModelOptions, Pipeline, RuntimeOptions
from ovbuild.runtime.request import GenerationConfig

from bench_row_padding import export_pair
from bench_vs_genai import PROMPTS

PRECISIONS = {"bf16 (device default)": "bf16", "f32": "f32"}


def serve(pipeline: Pipeline, prompts: list[list[int]], k: int) -> tuple[float, float, float, list[list[int]]]:
    """One request at a time: (draft seconds per step, wall seconds per step, mean acceptance length, tokens)."""
    draft_s = wall_s = steps = accepted = verified = 0
    tokens = []
    for prompt in prompts:
        scheduler = pipeline.scheduler()
        request = scheduler.add_request(prompt, GenerationConfig(64, num_assistant_tokens=k))
        scheduler.run()
        m = scheduler.metrics
        draft_s, wall_s, steps = draft_s + m.draft_infer_s, wall_s + m.wall_s, steps + m.steps
        accepted, verified = accepted + request.metrics.num_accepted_tokens, verified + request.metrics.num_drafts
        tokens.append(request.generated)
    return draft_s / steps, wall_s / steps, 1 + accepted / max(verified, 1), tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--k", type=int, nargs="+", default=[3, 5])
    parser.add_argument("--prompts", type=int, default=16)
    args = parser.parse_args()
    print(describe())
    with tempfile.TemporaryDirectory(prefix="ovbuild_draft_precision_") as tmp:
        target, draft = export_pair(Path(tmp))
        pipelines = {
            name: Pipeline(
                target,
                draft,
                RuntimeOptions(
                    target=EXACT_TARGET,
                    draft=ModelOptions(FAST_DRAFT.kv_cache_precision, precision, FAST_DRAFT.cache_mb),
                ),
            )
            for name, precision in PRECISIONS.items()
        }
        for pipeline in pipelines.values():  # every row count's copy now (static_rows): no timed run compiles one
            pipeline.compile_copies()
        prompts = [next(iter(pipelines.values())).encode(p) for p in PROMPTS[: args.prompts]]
        print(f"demo pair, one request at a time, {len(prompts)} prompts x 64 tokens, {args.rounds} rounds")
        for k in args.k:
            for pipeline in pipelines.values():  # warm-up
                serve(pipeline, prompts, k)
            runs = {name: [] for name in pipelines}
            for _ in range(args.rounds):
                for name in random.sample(list(pipelines), len(pipelines)):
                    runs[name].append(serve(pipelines[name], prompts, k))
            (bf16_name, bf16), (f32_name, f32) = runs.items()
            assert bf16[0][3] == f32[0][3], "the two drafts' runs generated different tokens"
            print(f"  k = {k}:")
            for name, values in runs.items():
                draft_ms = statistics.median(v[0] for v in values) * 1e3
                wall_ms = statistics.median(v[1] for v in values) * 1e3
                print(
                    f"    {name:<22} draft {draft_ms:.3f} ms/step   wall {wall_ms:.3f} ms/step   tau {values[0][2]:.2f}"
                )
            draft_ratio = statistics.median(b[0] / f[0] for b, f in zip(bf16, f32, strict=True))
            wall_ratio = statistics.median(b[1] / f[1] for b, f in zip(bf16, f32, strict=True))
            print(f"    {bf16_name} / {f32_name}: draft time {draft_ratio:.2f}x, wall time {wall_ratio:.2f}x")


if __name__ == "__main__":
    main()

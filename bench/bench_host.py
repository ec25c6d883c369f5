"""Host time per scheduler step (the step's wall time minus its model calls) on the demo pair: the target alone, with
the draft at a pinned draft length of 0 (taps and draft-side bookkeeping, no draft call) and with the adaptive draft
length (plans too), at several concurrencies. Side by side in one process, interleaved rounds, medians. The model
calls' own host work (inputs, layout, binding) counts as call time here; bench_lean_calls.py measures that part.

    python bench/bench_host.py [--rounds 15] [--concurrency 1 4 32]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import numpy as np

from ovbuild.demo import shipped_pair
from ovbuild.export import export
from ovbuild.runtime.machine import describe
from ovbuild.runtime.pipeline import EXACT_TARGET, ModelOptions, Pipeline, RuntimeOptions
from ovbuild.runtime.request import GenerationConfig

from bench_row_padding import export_pair
from bench_vs_genai import PROMPTS


def host_per_step(pipeline: Pipeline, prompts: list[list[int]], k: int | None) -> float:
    """Seconds per step outside the model calls, serving `prompts` at once with draft length `k` (None: adaptive)."""
    scheduler = pipeline.scheduler()
    for prompt in prompts:
        scheduler.add_request(prompt, GenerationConfig(64, num_assistant_tokens=k))
    scheduler.run()
    m = scheduler.metrics
    return (m.wall_s - m.target_infer_s - m.draft_infer_s - m.calibration_s) / m.steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 32])
    args = parser.parse_args()
    print(describe())
    with tempfile.TemporaryDirectory(prefix="ovbuild_host_") as tmp:
        tapped, draft = export_pair(Path(tmp))
        alone = export(shipped_pair()[0], Path(tmp) / "alone", quiet=True).out
        options = RuntimeOptions(target=ModelOptions(EXACT_TARGET.kv_cache_precision, "f32", 256))
        with_draft, without = Pipeline(tapped, draft, options), Pipeline(alone, None, options)
        modes = {
            "target alone": (without, None),
            "draft, k = 0": (with_draft, 0),
            "draft, adaptive": (with_draft, None),
        }
        rng = np.random.default_rng(0)
        print("host microseconds per step (median over rounds); extra over the target alone")
        for n in args.concurrency:
            prompts = [without.encode(p) for p in PROMPTS[:n]]
            for pipeline, k in modes.values():  # warm-up, and the adaptive planner's calibration
                host_per_step(pipeline, prompts, k)
            seconds = {name: [] for name in modes}
            for _ in range(args.rounds):
                for name in rng.permutation(list(modes)):
                    pipeline, k = modes[name]
                    seconds[name].append(host_per_step(pipeline, prompts, k))
            base = statistics.median(seconds["target alone"])
            line = "   ".join(
                f"{name} {statistics.median(v) * 1e6:6.0f} (+{(statistics.median(v) - base) * 1e6:.0f})"
                for name, v in seconds.items()
            )
            print(f"  {n:>2} requests: {line}")


if __name__ == "__main__":
    main()

"""Speculative sampling on the shipped demo pair: acceptance length and speed-up at temperature 0.7 and 1.0 (greedy
for reference), and the distribution of the first tokens with and without the draft over many seeds.

    python bench/bench_sampling_demo.py [--max-new-tokens 96] [--seeds 4] [--distribution-seeds 400]
"""

from __future__ import annotations

import argparse
import math
import tempfile
from collections import Counter
from pathlib import Path

from ovbuild.demo import DEMO_PROMPTS, export_pair, shipped_pair
from ovbuild.runtime.metrics import RunMetrics
from ovbuild.runtime.pipeline import Pipeline


def serve(pipeline: Pipeline, use_draft: bool, max_new_tokens: int, seeds: int, **sampling) -> RunMetrics:
    """Every demo prompt as one request, one at a time, for each seed; totals."""
    total = RunMetrics()
    for seed in range(seeds):
        for prompt in DEMO_PROMPTS:
            extra = dict(sampling, rng_seed=seed) if sampling.get("do_sample") else sampling
            _, metrics = pipeline.generate([prompt], max_new_tokens, use_draft=use_draft, **extra)
            total.merge(metrics)
    return total


def first_tokens(pipeline: Pipeline, use_draft: bool, seeds: int, n: int, temperature: float) -> list[tuple]:
    """The first n tokens of the first demo prompt under each of `seeds` seeds, all requests in one batch (the first
    token comes from the prefill, so it is the same with and without the draft by construction)."""
    scheduler = pipeline.scheduler(use_draft=use_draft)
    from ovbuild.runtime.request import GenerationConfig

    prompt = pipeline.encode(DEMO_PROMPTS[0])
    requests = [
        # max_new_tokens n + 2: the last tokens of a request get no draft, the first n do
        scheduler.add_request(
            prompt,
            GenerationConfig(
                n + 2, do_sample=True, temperature=temperature, rng_seed=s, speculative_sampling="rejection"
            ),
        )
        for s in range(seeds)
    ]
    scheduler.run()
    return [tuple(r.generated[:n]) for r in requests]


def compare(a: Counter, b: Counter) -> str:
    """Total variation between the two empirical distributions and a pooled two-sample chi-square vs its 1e-3 bound."""
    n = sum(a.values())
    tv = 0.5 * sum(abs(a[c] - b[c]) for c in set(a) | set(b)) / n
    cells = set(a) | set(b)
    big = [c for c in cells if a[c] + b[c] >= 10]
    rest = [c for c in cells if a[c] + b[c] < 10]
    pairs = [(a[c], b[c]) for c in big] + [(sum(a[c] for c in rest), sum(b[c] for c in rest))]
    stat = sum((x - y) ** 2 / (x + y) for x, y in pairs if x + y)
    df = max(len(pairs) - 1, 1)
    critical = df * (1 - 2 / (9 * df) + 3.09 * math.sqrt(2 / (9 * df))) ** 3
    return f"TV {tv:.3f}, chi-square {stat:.1f} (1e-3 bound {critical:.1f}, {len(cells)} distinct sequences)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--distribution-seeds", type=int, default=400)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ovbuild_bench_") as tmp:
        pipeline = Pipeline(*export_pair(*shipped_pair(), Path(tmp)))
        pipeline.generate(list(DEMO_PROMPTS[:1]), max_new_tokens=4)  # warm-up
        print(
            f"demo pair, {len(DEMO_PROMPTS)} prompts x {args.seeds} seeds, {args.max_new_tokens} new tokens, "
            "one request at a time"
        )
        print(f"{'mode':>16} {'accept len':>10} {'draft tok/s':>11} {'alone tok/s':>11} {'speed-up':>8}")
        modes = {"greedy": {}}
        for rule in ("exact", "rejection"):
            for t in (0.7, 1.0):
                modes[f"T={t} {rule}"] = dict(do_sample=True, temperature=t, speculative_sampling=rule)
        for name, sampling in modes.items():
            seeds = 1 if not sampling else args.seeds
            spec = serve(pipeline, True, args.max_new_tokens, seeds, **sampling)
            alone = serve(pipeline, False, args.max_new_tokens, seeds, **sampling)
            print(
                f"{name:>16} {spec.requests.mean_acceptance_length:10.2f} {spec.tokens_per_second:11.1f} "
                f"{alone.tokens_per_second:11.1f} {spec.tokens_per_second / alone.tokens_per_second:8.2f}"
            )
        for temperature in (0.7, 1.0):
            with_draft, without = (first_tokens(pipeline, d, args.distribution_seeds, 4, temperature) for d in (1, 0))
            for i in (1, 2, 3):  # token 0 comes from the prefill: identical by construction
                same = sum(a[: i + 1] == b[: i + 1] for a, b in zip(with_draft, without, strict=True)) / len(without)
                print(
                    f"T={temperature} token {i}, {args.distribution_seeds} seeds each way: "
                    f"{compare(Counter(a[i] for a in with_draft), Counter(b[i] for b in without))}; first {i + 1} "
                    f"tokens identical per seed {same:.0%}"
                )


if __name__ == "__main__":
    main()

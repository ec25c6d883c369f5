"""What leaving the taps out saves: the demo pair served while drafting does not pay, with and without the untapped
sibling (PagedModel.can_skip_taps), next to the target exported without taps.

1. Per call: the demo target's tapped model and its untapped sibling, verification-shaped calls (1-row subsequences)
   of 1, 4 and 32 rows after 48 cached tokens, alternating call by call.
2. Serving: ovbuild alone (the target exported without taps) and the draft pipeline with taps left out while the
   planner has backed off (the default) and with every call tapped (the runtime before it), one request at a time
   and 4, 16 and 32 at once; every mode's tokens must equal ovbuild alone's. Each pipeline is warmed up first, so
   that its planner has backed off as far as it goes (what a server reaches after its first requests).
3. The resident memory the untapped sibling and its static copies add.

Side by side in one process, interleaved rounds in a new order each round, medians; ratios within rounds.

    python bench/bench_untapped.py [--rounds 9] [--calls 40] [--concurrency 1 4 16 32] [--inference-precision bf16]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from bench_static_rows import resident_mb

from ovbuild.demo import DEMO_PROMPTS, shipped_pair
from ovbuild.export import export
from ovbuild.runtime.kv_cache import SequenceRows
from ovbuild.runtime.machine import describe
from ovbuild.runtime.paged_model import PagedModel
from ovbuild.runtime.pipeline import EXACT_TARGET, ModelOptions, Pipeline, RuntimeOptions
from ovbuild.runtime.request import GenerationConfig
from ovbuild.runtime.static_rows import BUCKETS

CONTEXT = 48


def verify_call(target: PagedModel, rows: int, taps: bool) -> float:
    """One call of `rows` 1-row subsequences after CONTEXT cached tokens of sequence 0 (rolled back by the next)."""
    feeds = {
        "input_ids": np.full(rows, 5),
        "position_ids": np.arange(CONTEXT, CONTEXT + rows),
        "logits_indices": np.arange(rows),
    }
    start = time.perf_counter()
    target.run([SequenceRows(0, CONTEXT + i, 1) for i in range(rows)], feeds, taps=taps)
    return time.perf_counter() - start


def per_call(target: PagedModel, n_rounds: int, n_calls: int, rng: np.random.Generator) -> None:
    target.run([SequenceRows(0, 0, CONTEXT)], {"input_ids": np.full(CONTEXT, 5), "position_ids": np.arange(CONTEXT)})
    print("per call, tapped / untapped (median over rounds of each round's median call):")
    for rows in (1, 4, 32):
        seconds = {True: [], False: []}
        for _ in range(n_rounds):
            calls = {True: [], False: []}
            for _ in range(n_calls):
                for taps in rng.permutation([True, False]):
                    calls[bool(taps)].append(verify_call(target, rows, bool(taps)))
            for taps in seconds:
                seconds[taps].append(statistics.median(calls[taps]))
        ratios = [t / u for t, u in zip(seconds[True], seconds[False], strict=True)]
        print(
            f"  {rows:2d} rows: tapped {statistics.median(seconds[True]) * 1e3:.3f} ms, untapped "
            f"{statistics.median(seconds[False]) * 1e3:.3f} ms, ratio {statistics.median(ratios):.2f}x "
            f"(rounds {min(ratios):.2f}-{max(ratios):.2f})"
        )


def serve(pipeline: Pipeline, prompts: list[list[int]], concurrency: int, use_draft: bool) -> list[list[int]]:
    """Every prompt, `concurrency` at once (one scheduler per batch, as a server's requests come and go)."""
    config, out = GenerationConfig(max_new_tokens=64, eos_token_ids=()), []
    for begin in range(0, len(prompts), concurrency):
        scheduler = pipeline.scheduler(use_draft=use_draft)
        requests = [scheduler.add_request(p, config) for p in prompts[begin : begin + concurrency]]
        scheduler.run()
        out += [r.generated for r in requests]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 32])
    parser.add_argument("--inference-precision", default="bf16", choices=("f32", "bf16"), help="the target's math")
    args = parser.parse_args()
    print(describe())
    rng = np.random.default_rng(0)
    options = RuntimeOptions(target=ModelOptions("f16", args.inference_precision, EXACT_TARGET.cache_mb))
    with tempfile.TemporaryDirectory(prefix="ovbuild_untapped_") as tmp:
        tmp = Path(tmp)
        target_ckpt, draft_ckpt = shipped_pair()
        target_dir = export(target_ckpt, tmp / "target", draft_of=draft_ckpt, quiet=True).out
        draft_dir = export(draft_ckpt, tmp / "draft", target_model=target_ckpt, quiet=True).out
        alone_dir = export(target_ckpt, tmp / "alone", quiet=True).out
        skipping, kept = (Pipeline(target_dir, draft_dir, options) for _ in range(2))
        alone = Pipeline(alone_dir, None, options)
        kept.target.can_skip_taps = False  # every call tapped: the draft pipeline as it ran before the sibling
        for pipeline in (alone, kept):
            pipeline.compile_copies()
        before = resident_mb()
        for rows in BUCKETS:
            skipping.target.static.copy(rows)
        middle = resident_mb()
        skipping.target.untapped().compile_copies()
        after = resident_mb()
        skipping.compile_copies()  # the draft's copies
        print(f"memory: the target's copies +{middle - before:.0f} MB, its untapped sibling with its copies ", end="")
        print(f"+{after - middle:.0f} MB\n")
        per_call(skipping.target, args.rounds, args.calls, rng)
        prompts = [alone.encode(p) for p in DEMO_PROMPTS]
        for concurrency in args.concurrency:
            batch = (prompts * (-(-max(concurrency, 4) // len(prompts))))[: max(concurrency, 4)]
            modes = {
                "ovbuild alone": lambda b=batch, c=concurrency: serve(alone, b, c, False),
                "draft, taps left out": lambda b=batch, c=concurrency: serve(skipping, b, c, True),
                "draft, every call tapped": lambda b=batch, c=concurrency: serve(kept, b, c, True),
            }
            reference = modes["ovbuild alone"]()
            for name, run in modes.items():
                for _ in range(2):  # warm-up: the planner backs off as far as it goes
                    if run() != reference:
                        raise SystemExit(f"{name}: tokens differ from ovbuild alone")
            seconds = {name: [] for name in modes}
            for _ in range(args.rounds):
                for name in rng.permutation(list(modes)):
                    start = time.perf_counter()
                    modes[name]()
                    seconds[name].append(time.perf_counter() - start)
            print(f"\n{concurrency} request(s) at once, {len(batch)} prompts, 64 tokens each:")
            for name, values in seconds.items():
                ratios = [a / v for a, v in zip(seconds["ovbuild alone"], values, strict=True)]
                tokens = 64 * len(batch) / statistics.median(values)
                print(
                    f"  {name:<26} {tokens:7.0f} tokens/s   speed / alone's {statistics.median(ratios):.2f}x "
                    f"(rounds {min(ratios):.2f}-{max(ratios):.2f})"
                )
            pairs = zip(seconds["draft, every call tapped"], seconds["draft, taps left out"], strict=True)
            ratios = [tapped / left for tapped, left in pairs]
            print(
                f"  taps left out / every call tapped: {statistics.median(ratios):.2f}x "
                f"(rounds {min(ratios):.2f}-{max(ratios):.2f})"
            )


if __name__ == "__main__":
    main()

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

from ovbuild.demo import shipped_pair
from ovbuild.export import export
from ovbuild.runtime.kv_cache import SequenceRows
from ovbuild.runtime.machine import describe
from ovbuild.runtime.paged_model import PagedModel
from ovbuild.runtime.pipeline import EXACT_TARGET, ModelOptions, Pipeline, RuntimeOptions
from ovbuild.runtime.static_rows import COPY_ROWS as BUCKETS

from bench_target_precision import serve_side_by_side

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
        modes = {
            ("ovbuild", "alone"): alone,
            ("ovbuild", "draft, taps left out"): skipping,
            ("ovbuild", "draft, every call tapped"): kept,
        }
        # two warm-ups: the planner backs off as far as it goes, as a server's does after its first requests
        measured = serve_side_by_side(modes, args.rounds, args.concurrency, warmups=2)
        print("\ntaps left out / every call tapped (median of per-round ratios, min-max):")
        for n, seconds in measured.items():
            tapped, left_out = (
                seconds[("ovbuild", "draft, every call tapped")],
                seconds[("ovbuild", "draft, taps left out")],
            )
            ratios = [t / s for t, s in zip(tapped, left_out, strict=True)]
            print(f"  {n:2d} at once: {statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})")


if __name__ == "__main__":
    main()

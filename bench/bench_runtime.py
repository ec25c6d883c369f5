"""Runtime benchmark: a target and draft pair with 1, 4 and 16 concurrent requests, with the draft and alone.

Prints tokens/s, mean acceptance length and where the time goes (target inference, draft inference, host Python),
all measured side by side in one run. By default it uses the tiny random pair (which accepts little: it measures
overhead); pass --target/--draft checkpoint folders (e.g. the shipped demo pair) for a real acceptance rate.

    python bench/bench_runtime.py [--target CKPT --draft CKPT] [--new-tokens 64]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

from ovbuild.families import load_draft
from ovbuild.graph.dflash import build_dflash_draft
from ovbuild.graph.target import build_target
from ovbuild.runtime.drafters import BlockDrafter
from ovbuild.runtime.paged_model import PagedModel
from ovbuild.runtime.request import GenerationConfig
from ovbuild.runtime.scheduler import Scheduler
from ovbuild.runtime.speculation import Speculation
from ovbuild.targets import load_target
from ovbuild.testing import write_tiny_dflash, write_tiny_target
from ovbuild.weights.checkpoint import Checkpoint


def run(target_model, draft_model, prompts, new_tokens, options, repeats):
    """Best-of-`repeats` wall time for all prompts as concurrent requests; returns the scheduler's metrics."""
    best = None
    target = PagedModel(target_model, **options)
    drafter = BlockDrafter(draft_model, **options) if draft_model is not None else None
    # one planner for all repeats, as a Pipeline keeps one across runs: a new one would calibrate in every repeat
    speculation = Speculation(drafter.max_candidates, drafter.candidate_offset) if drafter is not None else None
    for _ in range(repeats):
        scheduler = Scheduler(target, drafter, speculation=speculation)
        for p in prompts:
            scheduler.add_request(p, GenerationConfig(max_new_tokens=new_tokens))
        scheduler.run()
        if best is None or scheduler.metrics.wall_s < best.wall_s:
            best = scheduler.metrics
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", help="target checkpoint folder (default: tiny random)")
    parser.add_argument("--draft", help="DFlash draft checkpoint folder (default: tiny random)")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--kv-cache-precision", default="u8")
    parser.add_argument("--inference-precision", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        target_dir = Path(args.target) if args.target else write_tiny_target(Path(tmp) / "t")
        draft_dir = Path(args.draft) if args.draft else write_tiny_dflash(Path(tmp) / "d")
        tcfg, tweights = load_target(Checkpoint.open(target_dir))
        dcfg, dweights = load_draft(Checkpoint.open(draft_dir))
        target_model = build_target(tcfg, tweights, dcfg.target_layer_ids)
        draft_model = build_dflash_draft(dcfg, dweights, tweights)
        rng = np.random.default_rng(0)
        options = {"kv_cache_precision": args.kv_cache_precision, "inference_precision": args.inference_precision}
        print(
            f"target {target_dir.name}: {tcfg.num_layers} layers, hidden {tcfg.hidden_size}; draft "
            f"{dcfg.num_layers} layers, block {dcfg.block_size}; {args.new_tokens} new tokens per request"
        )
        header = (
            f"{'requests':>8} {'mode':>7} {'tok/s':>8} {'speedup':>7} {'accept len':>10} {'steps':>6} "
            f"{'target ms':>9} {'draft ms':>9} {'host ms':>8} {'host %':>6} {'host ms/step':>12}"
        )
        print(header)
        for n in (1, 4, 16):
            prompts = [rng.integers(0, min(tcfg.vocab_size, 256), 32).tolist() for _ in range(n)]
            alone = run(target_model, None, prompts, args.new_tokens, options, args.repeats)
            spec = run(target_model, draft_model, prompts, args.new_tokens, options, args.repeats)
            for mode, m in (("alone", alone), ("draft", spec)):
                speedup = m.tokens_per_second / alone.tokens_per_second
                print(
                    f"{n:>8} {mode:>7} {m.tokens_per_second:>8.1f} {speedup:>6.2f}x "
                    f"{m.requests.mean_acceptance_length:>10.2f} {m.steps:>6} {m.target_infer_s * 1e3:>9.1f} "
                    f"{m.draft_infer_s * 1e3:>9.1f} {m.host_s * 1e3:>8.1f} {100 * m.host_s / m.wall_s:>5.1f}% "
                    f"{m.host_s * 1e3 / m.steps:>12.3f}"
                )


if __name__ == "__main__":
    main()

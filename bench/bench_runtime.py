"""Runtime benchmark: a target and draft pair with 1, 4 and 16 concurrent requests, with the draft and alone.

Prints tokens/s, mean acceptance length and where the time goes (target inference, draft inference, host Python),
all measured side by side in one run. By default it uses the tiny random pair (which accepts little: it measures
overhead); pass --target/--draft checkpoint folders (e.g. the shipped demo pair) for a real acceptance rate.

    python bench/bench_runtime.py [--target CKPT --draft CKPT] [--new-tokens 64] [--rounds 3]
"""

from __future__ import annotations

import argparse
import functools
import tempfile
from pathlib import Path

import numpy as np

from ovbuild.families import load_draft
from ovbuild.graph.dflash import build_dflash_draft
from ovbuild.graph.target import build_target
from ovbuild.runtime.model.paged_model import PagedModel
from ovbuild.runtime.request import GenerationConfig
from ovbuild.runtime.scheduler import Scheduler
from ovbuild.runtime.speculation.drafters import BlockDrafter
from ovbuild.runtime.speculation.planner import Speculation
from ovbuild.targets import load_target
from ovbuild.testing import write_tiny_dflash, write_tiny_target
from ovbuild.weights.checkpoint import Checkpoint

import harness


class Mode:
    """One side: a target (and draft) compiled once, with one planner across rounds (as a Pipeline keeps one: a new
    one would calibrate in every round); each call serves all prompts as concurrent requests."""

    def __init__(self, target_model, draft_model, options: dict):
        self.target = PagedModel(target_model, **options)
        self.drafter = BlockDrafter(draft_model, **options) if draft_model is not None else None
        spec = self.drafter and Speculation(self.drafter.max_candidates, self.drafter.candidate_offset)
        self.speculation = spec
        self.metrics = None  # the last run's

    def __call__(self, prompts: list[list[int]], new_tokens: int) -> harness.Measured:
        scheduler = Scheduler(self.target, self.drafter, speculation=self.speculation)
        requests = [scheduler.add_request(p, GenerationConfig(max_new_tokens=new_tokens)) for p in prompts]
        scheduler.run()
        self.metrics = scheduler.metrics
        return harness.Measured(scheduler.metrics.wall_s, [r.generated for r in requests])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", help="target checkpoint folder (default: tiny random)")
    parser.add_argument("--draft", help="DFlash draft checkpoint folder (default: tiny random)")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--kv-cache-precision", default="u8")
    parser.add_argument("--inference-precision", default=None)
    harness.add_arguments(parser, rounds=3)
    args = parser.parse_args()
    harness.start("Runtime: a target and draft pair, 1, 4 and 16 concurrent requests, with the draft and alone")
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
            f"{'requests':>8} {'mode':>7} {'tok/s':>8} {'speed-up (range)':>18} {'accept len':>10} {'steps':>6} "
            f"{'target ms':>9} {'draft ms':>9} {'host ms':>8} {'host %':>6} {'host ms/step':>12}"
        )
        print(header)
        modes = {"alone": Mode(target_model, None, options), "draft": Mode(target_model, draft_model, options)}
        for n in (1, 4, 16):
            prompts = [rng.integers(0, min(tcfg.vocab_size, 256), 32).tolist() for _ in range(n)]
            cases = {name: functools.partial(mode, prompts, args.new_tokens) for name, mode in modes.items()}
            rounds = harness.interleave(cases, args.rounds, seed=args.seed + n)
            harness.require_equal(rounds.outputs, "alone")  # greedy speculative decoding is lossless
            for name, mode in modes.items():
                m = mode.metrics  # the last round's breakdown
                tokens_per_s = n * args.new_tokens / rounds.median(name)
                print(
                    f"{n:>8} {name:>7} {tokens_per_s:>8.1f} {rounds.ratio('alone', name)!s:>18} "
                    f"{m.requests.mean_acceptance_length:>10.2f} {m.steps:>6} {m.target_infer_s * 1e3:>9.1f} "
                    f"{m.draft_infer_s * 1e3:>9.1f} {m.host_s * 1e3:>8.1f} {100 * m.host_s / m.wall_s:>5.1f}% "
                    f"{m.host_s * 1e3 / m.steps:>12.3f}"
                )


if __name__ == "__main__":
    main()

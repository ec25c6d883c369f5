"""Runtime benchmark: a target and draft pair with 1, 4 and 16 concurrent requests, with the draft and alone.

Prints tokens/s, mean acceptance length and where the time goes (target inference, draft inference, host Python),
all measured side by side in one run. By default it uses the tiny random pair (which accepts little: it measures
overhead); pass --target/--draft checkpoint folders (e.g. the shipped demo pair) for a real acceptance rate.

`--losing` serves a pair where drafting loses: a random target of 6 layers and hidden 256 and its 2-layer draft (the
target only three times the draft's depth), the draft steered (ovbuild.testing.steered) to be right at each position
with chance 0.35 (mean acceptance length about 1.5). There no draft length pays, so the adaptive planner must run as
fast as the target alone (within the A/A noise: the target alone twice per round); a pinned k = 3 shows what drafting
would cost. `--losing-hidden` widens both (heads of 32, the MLP 3x the hidden size): at hidden 256 a target call takes
0.35 ms, where the draft pipeline's host work on every step (tens of microseconds of Python) weighs as much as the
planner's choices; at 512, a few milliseconds.

    python bench/bench_runtime.py [--target CKPT --draft CKPT | --losing [--losing-hidden 256]] [--new-tokens 64]
        [--rounds 3]

With --structured it measures constrained decoding instead (docs/serve.md#structured-output): a JSON schema against
no constraint at 1 and 16 requests, alone and with the draft, whose proposals are masked by the grammar (its best
allowed token where it chose a refused one), the same without the draft's logits (the first allowed token), or left
whole (for comparison); the
mask's cost per generated token and per masked row. On the tiny random pair the draft is steered (the target alone's
tokens, each position right with chance 0.7: a good draft's acceptance); with --target/--draft (e.g. the demo pair's
checkpoints, which have a tokenizer) it is the real draft.

    python bench/bench_runtime.py --structured [--target CKPT --draft CKPT] [--new-tokens 64] [--rounds 3]
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
from ovbuild.runtime import draft_step
from ovbuild.runtime.model.paged_model import PagedModel
from ovbuild.runtime.pipeline import eos_token_ids
from ovbuild.runtime.request import GenerationConfig
from ovbuild.runtime.scheduler import Scheduler
from ovbuild.runtime.speculation.drafters import BlockDrafter, Proposal
from ovbuild.runtime.speculation.planner import Speculation
from ovbuild.runtime.structured.grammar import Grammars
from ovbuild.runtime.structured.spec import Constraint
from ovbuild.targets import load_target
from ovbuild.testing import write_tiny_dflash, write_tiny_target
from ovbuild.testing.planner import fixed_speculation
from ovbuild.testing.steered import SteeredDrafter
from ovbuild.testing.tokenizer import EOS_ID, write_tokenizer
from ovbuild.weights.checkpoint import Checkpoint

import harness

# --losing: the steered draft's chance of being right at a position
LOSING_CHANCE = 0.35


def losing_widths(hidden: int) -> dict:
    """The losing pair's widths at this hidden size: heads of 32 (as the tiny checkpoints have), half as many KV heads,
    an MLP three times as wide."""
    heads = hidden // 32
    return dict(
        hidden_size=hidden, intermediate_size=3 * hidden, num_attention_heads=heads, num_key_value_heads=heads // 2
    )


class Mode:
    """One side: a draft (or none) over the target every mode shares, with one planner across rounds (as a Pipeline
    keeps one: a new one would calibrate in every round); each call serves the next set of prompts as concurrent
    requests (every mode is called once per round, so all modes of a round serve the same set). steer: wrap the draft
    in a SteeredDrafter right with this chance at each position (its truths set by `truths`); pinned: a fixed k.

    One compiled target and cache for every mode, as a Pipeline's schedulers with and without the draft share them:
    with one each, the modes' ratios moved by up to 2% with the instance (where its cache and buffers landed), more
    than the host work the losing pair is there to show. Prefix caching is off, so that no mode starts on blocks
    another mode of the round computed (every round's prompts are new: it saves nothing within a mode)."""

    def __init__(
        self, target: PagedModel, draft_model, options: dict, steer: float | None = None, pinned: int | None = None
    ):
        self.target = target
        self.drafter = BlockDrafter(draft_model, **options) if draft_model is not None else None
        if self.drafter is not None and steer is not None:
            vocab = self.target.vocab_size
            self.drafter = SteeredDrafter(self.drafter, vocab, accept_chance=steer)
        # every static copy compiled before timing, as the server does (Pipeline.compile_copies): compiled on first
        # use instead, a copy took 0.1-0.3 s in the middle of a timed round, the first time a retry drafted its size
        if self.drafter is not None:
            self.drafter.compile_copies()
        spec = self.drafter and Speculation(self.drafter.max_candidates, self.drafter.candidate_offset)
        self.speculation, self.pinned = spec, pinned
        self.truths: dict[tuple[int, ...], list[int]] = {}  # prompt -> prompt + the target alone's tokens
        self.metrics = None  # the last run's
        self.calls = 0

    def next_set(self, prompt_sets: list[list[list[int]]], new_tokens: int) -> harness.Measured:
        """Serve the next of `prompt_sets` (the first after the last: modes called alike serve the same sets)."""
        self.calls += 1
        return self(prompt_sets[(self.calls - 1) % len(prompt_sets)], new_tokens)

    def __call__(self, prompts: list[list[int]], new_tokens: int) -> harness.Measured:
        scheduler = Scheduler(self.target, self.drafter, speculation=self.speculation, enable_prefix_caching=False)
        config = GenerationConfig(max_new_tokens=new_tokens, num_assistant_tokens=self.pinned)
        requests = [scheduler.add_request(p, config) for p in prompts]
        if isinstance(self.drafter, SteeredDrafter):
            for r, p in zip(requests, prompts, strict=True):
                self.drafter.truths[r.id] = self.truths[tuple(p)]
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
    parser.add_argument("--structured", action="store_true", help="constrained against free decoding (see above)")
    parser.add_argument("--losing", action="store_true", help="a pair where drafting loses (see above)")
    parser.add_argument("--losing-hidden", type=int, default=256, help="the losing pair's hidden size (see above)")
    harness.add_arguments(parser, rounds=3)
    args = parser.parse_args()
    if args.structured:
        structured_main(args)
        return
    harness.start("Runtime: a target and draft pair, 1, 4 and 16 concurrent requests, with the draft and alone")
    with tempfile.TemporaryDirectory() as tmp:
        widths = losing_widths(args.losing_hidden) if args.losing else {}
        hidden = widths.get("hidden_size", 64)
        target_dir = Path(args.target) if args.target else write_tiny_target(Path(tmp) / "t", **widths)
        draft_dir = (
            Path(args.draft) if args.draft else write_tiny_dflash(Path(tmp) / "d", target_hidden_size=hidden, **widths)
        )
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
            f"{'requests':>8} {'mode':>9} {'tok/s':>8} {'speed-up (range)':>18} {'accept len':>10} {'steps':>6} "
            f"{'target ms':>9} {'draft ms':>9} {'host ms':>8} {'host %':>6} {'host ms/step':>12} {'drafted':>7}"
        )
        if args.losing:
            print(f"a pair where drafting loses: the draft right at each position with chance {LOSING_CHANCE}")
        print(header)
        steer = LOSING_CHANCE if args.losing else None
        target = PagedModel(target_model, **options)
        target.compile_copies()  # see Mode
        modes = {"alone": Mode(target, None, options), "draft": Mode(target, draft_model, options, steer)}
        if args.losing:
            modes["alone A/A"] = Mode(target, None, options)  # how far the machine moves a ratio by itself
            modes["k=3"] = Mode(target, draft_model, options, steer, pinned=3)
        for n in (1, 4, 16):
            # A new text every round (the same for every mode of the round): the planner keeps what it learns across
            # rounds, as a pipeline does across requests, and on one text run again and again the retries it makes
            # while backed off fall on the same positions of it every run (where the steered draft happened to be
            # right: a run-wide first-position acceptance near 1 where it is 0.35, and a full block retried every ~200
            # steps).
            sets = [
                [rng.integers(0, min(tcfg.vocab_size, 256), 32).tolist() for _ in range(n)]
                for _ in range(args.rounds + 1)
            ]
            truths = {}
            for prompts in sets:
                outputs = modes["alone"](prompts, args.new_tokens).output
                truths |= {tuple(p): [*p, *t] for p, t in zip(prompts, outputs, strict=True)}
            for mode in modes.values():
                mode.truths, mode.calls = truths, 0
            cases = {name: functools.partial(mode.next_set, sets, args.new_tokens) for name, mode in modes.items()}
            rounds = harness.interleave(cases, args.rounds, seed=args.seed + n)
            harness.require_equal(rounds.outputs, "alone")  # greedy speculative decoding is lossless
            for name, mode in modes.items():
                m = mode.metrics  # the last round's breakdown
                tokens_per_s = n * args.new_tokens / rounds.median(name)
                print(
                    f"{n:>8} {name:>9} {tokens_per_s:>8.1f} {rounds.ratio('alone', name)!s:>18} "
                    f"{m.requests.mean_acceptance_length:>10.2f} {m.steps:>6} {m.target_infer_s * 1e3:>9.1f} "
                    f"{m.draft_infer_s * 1e3:>9.1f} {m.host_s * 1e3:>8.1f} {100 * m.host_s / m.wall_s:>5.1f}% "
                    f"{m.host_s * 1e3 / m.steps:>12.3f} {drafted_share(m):>7}"
                )


SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[a-z ]{1,24}$"},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 4},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "age", "tags", "ok"],
    "additionalProperties": False,
}


# how the draft's proposals meet the grammar: as the runtime does it (a refused token replaced by the draft's best
# allowed one), without the rows' logits (replaced by the first allowed token), or verified whole (refused tokens are
# then rejected by the target)
MASKED = draft_step.allowed_proposal
DRAFTING = {
    "masked": MASKED,
    "no logits": lambda request, proposal: MASKED(request, Proposal(proposal, proposal.q)),
    "whole": lambda request, proposal: proposal,
}


class Structured:
    """One side of the structured benchmark: the target alone or with a draft (steered or real; its proposals met by
    the grammar as `drafting` says), free or under the schema; truths: the target alone's tokens, for steering."""

    def __init__(self, target: PagedModel, draft, grammars, constrained: bool, drafting: str = "masked"):
        self.target, self.grammars, self.drafting = target, grammars, drafting
        self.draft = draft  # a BlockDrafter, or a function making a fresh steered drafter per run (it keeps positions)
        self.constraint = Constraint.json_schema(SCHEMA) if constrained else None
        self.truths: list[list[int]] = []
        self.scheduler = self.requests = None  # the last run's

    def __call__(self, prompts: list[list[int]], new_tokens: int) -> harness.Measured:
        drafter = self.draft() if callable(self.draft) else self.draft
        s = Scheduler(self.target, drafter, speculation=fixed_speculation(drafter), grammars=self.grammars)
        config = GenerationConfig(max_new_tokens=new_tokens, constraint=self.constraint)
        requests = [s.add_request(p, config) for p in prompts]
        if isinstance(drafter, SteeredDrafter):
            drafter.truths = {r.id: t for r, t in zip(requests, self.truths, strict=True)}
        keep = draft_step.allowed_proposal
        draft_step.allowed_proposal = DRAFTING[self.drafting]
        try:
            s.run()
        finally:
            draft_step.allowed_proposal = keep
        self.scheduler, self.requests = s, requests
        return harness.Measured(s.metrics.wall_s, [r.generated for r in requests])


def structured_main(args) -> None:
    harness.start("Structured output: a JSON schema against free decoding, 1 and 16 requests, alone and drafted")
    with tempfile.TemporaryDirectory() as tmp:
        steer = not args.target
        target_dir = Path(args.target) if args.target else write_tiny_target(Path(tmp) / "t")
        draft_dir = Path(args.draft) if args.draft else write_tiny_dflash(Path(tmp) / "d")
        if steer:
            write_tokenizer(target_dir)
        tcfg, tweights = load_target(Checkpoint.open(target_dir))
        dcfg, dweights = load_draft(Checkpoint.open(draft_dir))
        target_model = build_target(tcfg, tweights, dcfg.target_layer_ids)
        draft_model = build_dflash_draft(dcfg, dweights, tweights)
        options = {"kv_cache_precision": args.kv_cache_precision, "inference_precision": args.inference_precision}
        target = PagedModel(target_model, **options)
        eos = (EOS_ID,) if steer else eos_token_ids(target_dir)
        grammars = Grammars(target_dir / "tokenizer.json", eos, target.vocab_size)
        draft = BlockDrafter(draft_model, **options)
        if steer:
            draft = functools.partial(SteeredDrafter, draft, target.vocab_size, accept_chance=0.7)
        sides = {
            "free": Structured(target, None, grammars, False),
            "json": Structured(target, None, grammars, True),
            "free+draft": Structured(target, draft, grammars, False),
            **{f"json+draft {d}": Structured(target, draft, grammars, True, d) for d in DRAFTING},
        }
        kind = "tiny random pair, steered draft" if steer else f"{target_dir.name}, its draft"
        print(f"{kind}; vocabulary {target.vocab_size}; {args.new_tokens} new tokens at most per request")
        print(
            f"{'requests':>8} {'case':>17} {'tok/s':>8} {'tok/s vs free':>18} {'proposed':>8} {'accepted':>8} "
            f"{'accept len':>10} {'masked rows':>11} {'mask us/row':>11} {'mask us/token':>13}"
        )
        rng = np.random.default_rng(args.seed)
        for n in (1, 16):
            prompts = [rng.integers(0, 256, 24).tolist() for _ in range(n)]
            for free, constrained in ((sides["free"], False), (sides["json"], True)):  # the target alone's tokens
                truths = [[*p, *g] for p, g in zip(prompts, free(prompts, args.new_tokens).output, strict=True)]
                for side in sides.values():
                    if side.draft is not None and (side.constraint is not None) == constrained:
                        side.truths = truths
            cases = {name: functools.partial(side, prompts, args.new_tokens) for name, side in sides.items()}
            rounds = harness.interleave(cases, args.rounds, seed=args.seed + n)
            harness.require_equal(rounds.outputs, "free", ["free+draft"])
            harness.require_equal(rounds.outputs, "json", [f"json+draft {d}" for d in DRAFTING])
            free_tokens = sum(len(r.generated) for r in sides["free"].requests)
            for name, side in sides.items():
                m, requests = side.scheduler.metrics, side.requests
                tokens = sum(len(r.generated) for r in requests)
                rows = sum(r.constraint.mask_rows for r in requests if r.constraint)
                mask_s = sum(r.constraint.mask_s for r in requests if r.constraint)
                per_row = f"{mask_s / rows * 1e6:.1f}" if rows else "-"
                per_token = f"{mask_s / tokens * 1e6:.1f}" if rows else "-"
                # tokens/s over free's, within each round (a constrained answer may end before max tokens)
                speed = harness.ratio_of(
                    [tokens * f for f in rounds.seconds["free"]],
                    [free_tokens * t for t in rounds.seconds[name]],
                )
                print(
                    f"{n:>8} {name:>17} {tokens / rounds.median(name):>8.1f} {speed!s:>18} "
                    f"{m.requests.num_draft_tokens:>8} {m.requests.num_accepted_tokens:>8} "
                    f"{m.requests.mean_acceptance_length:>10.2f} {rows:>11} {per_row:>11} {per_token:>13}"
                )


def drafted_share(metrics) -> str:
    """The share of decode steps that drafted (a pinned or planned k above 0); '-' for the target alone."""
    histogram = metrics.requests.draft_length_histogram
    return f"{1 - histogram[0] / sum(histogram):.0%}" if histogram and sum(histogram) else "-"


if __name__ == "__main__":
    main()

"""`ovbuild demo`: export a target + DFlash draft pair, then run code-completion prompts with the draft and with the
target alone, one request at a time and all at once, and compare outputs, acceptance, the draft lengths the planner
chose and the speed (the speed-up taken within each round, reported as its median and spread over the rounds timed
after an untimed one).

The default pair is the small trained one shipped in `ovbuild/data/demo` (docs/demo_training.md); `tiny=True` uses
the random test pair instead (it accepts almost nothing: it shows the mechanics, not the speed-up). Where the planner
drafted in no step or in very few, speculation did not run, and the demo says so instead of printing the two sides'
ratio (then machine noise) as a speed-up.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from ovbuild.commands.options import add_runtime_arguments, check_runtime_arguments, runtime_options
from ovbuild.errors import ExportError, UnsupportedError
from ovbuild.runtime.metrics import RunMetrics

if TYPE_CHECKING:  # the runtime and the exporter load OpenVINO: imported when the demo runs, not for `ovbuild --help`
    from ovbuild.runtime.pipeline import Pipeline, RuntimeOptions
    from ovbuild.runtime.request import Request

DIM, PLAIN = "\x1b[2m", "\x1b[0m"

# Starts of Python code whose 96-token greedy continuation by the shipped target has no repeated 16-token run: a
# target this small loops on most prompts (a loop is trivial to draft and would flatter the acceptance), so these
# were picked from a longer list of code starts by that rule; tests/test_demo_pair.py checks it still holds.
DEMO_PROMPTS = (
    "class Stack:\n    def __init__(self):\n",
    "        except KeyError:\n            ",
    '    def close(self):\n        """Close the file."""\n',
    "class Timer:\n",
)


# Below this share of decode steps with a draft, the side "with the draft" ran the target alone in all but a few
# steps: the two sides' ratio is then the machine's noise, not the draft's speed-up, and is not shown as one.
MIN_DRAFTING_SHARE = 0.1


@dataclass
class Round:
    """One round: the prompts served with the draft, then at once with the target alone."""

    speculative: list[Request]
    alone: list[Request]
    speculative_metrics: RunMetrics
    alone_metrics: RunMetrics

    @property
    def speedup(self) -> float:
        return self.speculative_metrics.tokens_per_second / max(self.alone_metrics.tokens_per_second, 1e-9)


@dataclass
class Comparison:
    """One way of serving the prompts, with the draft and with the target alone, over several rounds; the speed-up
    is taken within each round (both sides back to back, so a busy moment of the machine hits both)."""

    name: str
    rounds: list[Round]

    @property
    def identical(self) -> bool:
        reference = [r.generated for r in self.rounds[0].alone]
        return all([r.generated for r in side] == reference for x in self.rounds for side in (x.speculative, x.alone))

    @property
    def speedups(self) -> list[float]:
        return [r.speedup for r in self.rounds]

    @property
    def speedup(self) -> float:
        """The median of the per-round speed-ups."""
        return statistics.median(self.speedups)

    @property
    def median_round(self) -> Round:
        """The round whose speed-up is the median (the lower middle one for an even count): its metrics are shown."""
        return next(r for r in self.rounds if r.speedup == statistics.median_low(self.speedups))

    @property
    def speculative(self) -> list[Request]:
        return self.median_round.speculative

    @property
    def speculative_metrics(self) -> RunMetrics:
        return self.median_round.speculative_metrics

    @property
    def alone_metrics(self) -> RunMetrics:
        return self.median_round.alone_metrics

    @property
    def draft_lengths(self) -> list[int]:
        """Decode steps (per request, over every round) that drafted 0, 1, 2, ... tokens."""
        totals: list[int] = []
        for r in self.rounds:
            part = r.speculative_metrics.requests.draft_length_histogram
            totals += [0] * (len(part) - len(totals))
            for k, steps in enumerate(part):
                totals[k] += steps
        return totals

    @property
    def drafting_share(self) -> float:
        """The share of decode steps in which the planner drafted at least one token (0 when none ran)."""
        lengths = self.draft_lengths
        return sum(lengths[1:]) / sum(lengths) if sum(lengths) else 0.0

    @property
    def speculation_ran(self) -> bool:
        """Whether the draft took part in enough steps for the two sides' ratio to be its speed-up."""
        return self.drafting_share >= MIN_DRAFTING_SHARE


@dataclass
class DemoRun:
    """The prompts, and both ways of serving them: one request at a time, then all requests at once."""

    prompts: list[str]
    one_at_a_time: Comparison
    concurrent: Comparison
    runtime: str  # how the device compiled the models (Pipeline.describe)

    @property
    def identical(self) -> bool:
        return self.one_at_a_time.identical and self.concurrent.identical


def shipped_pair() -> tuple[Path, Path]:
    """The trained demo checkpoints that ship with the package."""
    root = Path(str(resources.files("ovbuild") / "data" / "demo"))
    target, draft = root / "target", root / "draft"
    if not (target / "config.json").exists() or not (draft / "config.json").exists():
        raise ExportError(f"{root}: the demo checkpoints are missing from this installation")
    return target, draft


def export_pair(
    target_ckpt: Path, draft_ckpt: Path, out: Path, progress: Callable[[str], None] | None = None
) -> tuple[Path, Path]:
    """Export the pair as the README shows: the target with the draft's taps, the draft with the target's tables."""
    from ovbuild.export import export

    say = progress or _silent
    say("exporting the target")
    target = export(target_ckpt, out / "target", draft_of=draft_ckpt, quiet=True).out
    say("exporting the draft")
    draft = export(draft_ckpt, out / "draft", target_model=target_ckpt, quiet=True).out
    return target, draft


def compare(
    pipeline: Pipeline, name: str, batches: list[list[str]], max_new_tokens: int, k: int | None, rounds: int = 3
) -> Comparison:
    """Serve each batch of prompts as concurrent requests, `rounds` times with the draft and alone (totals over all
    batches per side), after one untimed round; every round produces the same tokens, only the times differ."""
    results = []
    # The untimed round: a way of serving first met in a timed round ran its first steps at up to twice their later
    # cost (memory left cold by the other way's calls: the first drafting steps of 4 requests at once took 7 ms, the
    # later ones 4.7), and only the side that happened to run first paid for it.
    for r in range(-1, rounds):
        sides = {}
        # every other round the target alone goes first: a side always run second would carry the first's effect on
        # caches and clocks into every ratio
        for use_draft in (True, False) if r % 2 == 0 else (False, True):
            requests, metrics = [], RunMetrics()
            for batch in batches:
                done, run = pipeline.generate(batch, max_new_tokens, k, use_draft=use_draft)
                requests.extend(done)
                metrics.merge(run)
            sides[use_draft] = (requests, metrics)
        (spec, spec_metrics), (alone, alone_metrics) = sides[True], sides[False]
        if r >= 0:
            results.append(Round(spec, alone, spec_metrics, alone_metrics))
    return Comparison(name, results)


def run_demo(
    prompts: list[str] | None = None,
    max_new_tokens: int = 96,
    tiny: bool = False,
    options: RuntimeOptions | None = None,
    num_assistant_tokens: int | None = None,
    rounds: int = 3,
    progress: Callable[[str], None] | None = None,
    keep: str | Path | None = None,
) -> DemoRun:
    """Export the pair into a temporary folder (into `keep`/target and `keep`/draft, left there for `ovbuild
    generate` and `ovbuild serve`, when given), then serve the prompts one at a time and all at once, `rounds` times
    each; `progress` hears a short line as each stage starts; num_assistant_tokens None = the adaptive length."""
    from ovbuild.runtime.pipeline import Pipeline

    if rounds < 1:
        raise UnsupportedError(f"rounds = {rounds}: the demo needs at least one round")
    say = progress or _silent
    prompts = list(prompts or DEMO_PROMPTS)
    with tempfile.TemporaryDirectory(prefix="ovbuild_demo_") as tmp:
        tmp = Path(tmp)
        if tiny:
            from ovbuild.testing import write_tiny_dflash, write_tiny_target

            say("writing the tiny random pair")
            sources = write_tiny_target(tmp / "ckpt" / "target"), write_tiny_dflash(tmp / "ckpt" / "draft")
        else:
            sources = shipped_pair()
        exported = export_pair(*sources, Path(keep) if keep is not None else tmp / "exported", say)
        say("compiling")
        pipeline = Pipeline(*exported, options)
        # First-call allocations, the draft-length planner's calibration and the copies compiled per row count
        # (ovbuild.runtime.model.static_rows) stay out of the timing: a copy compiled in a timed round (0.1-0.4 s, where
        # a round one request at a time takes 0.4-0.6 s a side) cut that round's speed-up by a fifth or more. Every
        # copy, as a draft call's row count depends on when the planner drafts.
        say("warming up")
        pipeline.compile_copies()
        for batch in [*([p] for p in prompts), prompts]:
            for use_draft in (True, False):
                pipeline.generate(
                    batch, max_new_tokens=4, num_assistant_tokens=num_assistant_tokens, use_draft=use_draft
                )
        forget_acceptance(pipeline)
        say(f"serving {len(prompts)} prompts one request at a time, {_rounds(rounds)}")
        single = compare(
            pipeline, "one request at a time", [[p] for p in prompts], max_new_tokens, num_assistant_tokens, rounds
        )
        say(f"serving {len(prompts)} concurrent requests, {_rounds(rounds)}")
        together = compare(
            pipeline, f"{len(prompts)} concurrent requests", [prompts], max_new_tokens, num_assistant_tokens, rounds
        )
    return DemoRun(prompts, single, together, pipeline.describe())


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "demo",
        help="export the built-in pair and compare speculative decoding with the target alone",
        description="Export the shipped small target and DFlash draft, run code-completion prompts one request at a "
        "time and all at once, with the draft and with the target alone, and print the outputs, the acceptance "
        "metrics and the speed-ups (all measured in this one run, each round running both sides back to back).",
    )
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument(
        "--num-assistant-tokens", type=int, help="draft tokens verified per step (default: chosen each step)"
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="timed rounds per way of serving, after an untimed one (the speed-up is their median)",
    )
    p.add_argument("--prompt", action="append", help="replace the built-in prompts (repeatable)")
    p.add_argument("--tiny", action="store_true", help="use the random test pair instead of the trained one")
    p.add_argument(
        "--keep",
        metavar="DIR",
        help="export the pair into DIR/target and DIR/draft and leave it there (then: ovbuild serve --target "
        "DIR/target --draft DIR/draft)",
    )
    add_runtime_arguments(p)
    p.set_defaults(run=run)


class Status:
    """Short `[  3.2 s] exporting the draft...` lines on stderr, timed from the command's start."""

    def __init__(self):
        self.start = time.perf_counter()

    def __call__(self, text: str, end: str = "...") -> None:
        print(f"[{time.perf_counter() - self.start:5.1f} s] {text}{end}", file=sys.stderr, flush=True)


def completion_block(number: int, prompt: str, request: Request, dim: bool) -> str:
    """A prompt and its completion: on a terminal the completion follows the dimmed prompt as one text; elsewhere
    each sits in its own labelled block."""
    about = f"{len(request.generated)} tokens, {request.finish_reason}"
    if dim:
        return f"--- request {number} ({about})\n{DIM}{prompt}{PLAIN}{request.text}"
    prompt = prompt.removesuffix("\n")  # the block's own line break ends it
    return f"--- prompt {number}\n{prompt}\n--- completion {number} ({about})\n{request.text}"


def run(args: argparse.Namespace) -> int:
    from ovbuild.runtime.report import format_metrics

    check_runtime_arguments(args, with_draft=True)  # before the pair is exported
    status = Status()
    demo = run_demo(
        args.prompt,
        args.max_new_tokens,
        args.tiny,
        runtime_options(args),
        args.num_assistant_tokens,
        args.rounds,
        status,
        args.keep,
    )
    status("done", end="")
    dim = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
    blocks = [
        completion_block(i + 1, p, r, dim)
        for i, (p, r) in enumerate(zip(demo.prompts, demo.concurrent.speculative, strict=True))
    ]
    print("\n\n".join(blocks))
    for c in (demo.one_at_a_time, demo.concurrent):
        print(f"\n=== {c.name}, with the draft (speculative decoding), median round")
        print(format_metrics(c.speculative_metrics, with_draft=True))
        print(f"=== {c.name}, target alone, median round")
        print(format_metrics(c.alone_metrics, with_draft=False))
    print(f"\nruntime: {demo.runtime}")
    if args.keep:
        print(f"the exported pair: {args.keep}/target and {args.keep}/draft")
    print(f"outputs identical with and without the draft: {'yes' if demo.identical else 'NO'}")
    for c in (demo.one_at_a_time, demo.concurrent):
        print("\n".join(summary(c)))
    return 0 if demo.identical else 1


def summary(c: Comparison) -> list[str]:
    """What the draft did and what it bought, one way of serving: the draft lengths chosen, the acceptance and the
    speed-up, or, where the planner (almost) never drafted, that speculation did not run."""
    lengths = c.draft_lengths
    steps = sum(lengths)
    chosen = ", ".join(f"k={k} {n / steps:.0%}" for k, n in enumerate(lengths) if n) if steps else "none"
    lines = [f"draft lengths chosen, {c.name}: {chosen} of {steps} decode steps"]
    r = c.speculative_metrics.requests
    if not c.speculation_ran:
        lines.append(
            f"speculation did not run, {c.name}: the planner drafted in {sum(lengths[1:])} of {steps} decode steps "
            f"(it found drafting slower than the target alone on this machine), so both sides ran the target and "
            f"there is no speed-up to show ({c.speculative_metrics.tokens_per_second:.1f} vs "
            f"{c.alone_metrics.tokens_per_second:.1f} tokens/s in the median round; --num-assistant-tokens K pins k)"
        )
        return lines
    ratios = c.speedups
    lines += [
        f"acceptance, {c.name}: mean acceptance length {r.mean_acceptance_length:.2f} tokens per verification step, "
        f"{r.acceptance_rate:.0%} of {r.num_draft_tokens} draft tokens accepted (median round)",
        f"speed-up, {c.name}: {c.speedup:.2f}x, median of {len(ratios)} rounds (range {min(ratios):.2f}-"
        f"{max(ratios):.2f}x; median round {c.speculative_metrics.tokens_per_second:.1f} vs "
        f"{c.alone_metrics.tokens_per_second:.1f} tokens/s), drafting in {c.drafting_share:.0%} of decode steps",
    ]
    return lines


def forget_acceptance(pipeline: Pipeline) -> None:
    """Keep what the warm-up measured of the calls (costs, host time) and drop what it saw of the draft's acceptance.
    Its 4-token requests draft from prompts alone, where the demo draft is mostly wrong: on a busy 2-core machine
    their misses (run-wide acceptance 0.17 after warm-up) and one slow verification timing kept the planner from
    drafting in any later step, where it accepts 2.5 to 3.9 tokens per step."""
    from ovbuild.runtime.speculation.planner import Speculation

    warm = pipeline.speculation
    if warm is None:
        return
    fresh = Speculation(warm.max_candidates, warm.candidate_offset, warm.target_cost, warm.draft_cost)
    fresh.host_s, fresh.draft_host_s, fresh._drafting_host = warm.host_s, warm.draft_host_s, warm._drafting_host
    fresh.calibration_tried, fresh.calibration_cache = warm.calibration_tried, warm.calibration_cache
    pipeline.speculation = fresh


def _silent(_: str) -> None:
    pass


def _rounds(n: int) -> str:
    return f"{n} round{'s' if n != 1 else ''}"

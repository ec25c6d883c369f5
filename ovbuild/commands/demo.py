"""`ovbuild demo`: the built-in pair end to end, with the draft and with the target alone."""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import TYPE_CHECKING

from ovbuild.commands.options import add_runtime_arguments, check_runtime_arguments, runtime_options

if TYPE_CHECKING:
    from ovbuild.runtime.request import Request

DIM, PLAIN = "\x1b[2m", "\x1b[0m"


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
    p.add_argument("--rounds", type=int, default=3, help="rounds per way of serving (the speed-up is their median)")
    p.add_argument("--prompt", action="append", help="replace the built-in prompts (repeatable)")
    p.add_argument("--tiny", action="store_true", help="use the random test pair instead of the trained one")
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
    from ovbuild.demo import run_demo
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
    print(f"outputs identical with and without the draft: {'yes' if demo.identical else 'NO'}")
    for c in (demo.one_at_a_time, demo.concurrent):
        ratios = c.speedups
        print(
            f"speed-up, {c.name}: {c.speedup:.2f}x, median of {len(ratios)} rounds (range {min(ratios):.2f}-"
            f"{max(ratios):.2f}x; median round {c.speculative_metrics.tokens_per_second:.1f} vs "
            f"{c.alone_metrics.tokens_per_second:.1f} tokens/s)"
        )
    return 0 if demo.identical else 1

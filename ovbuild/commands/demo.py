"""`ovbuild demo`: the built-in pair end to end, with the draft and with the target alone."""

from __future__ import annotations

import argparse

from ovbuild.commands.generate import add_runtime_arguments, check_runtime_arguments, runtime_options


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "demo",
        help="export the built-in pair and compare speculative decoding with the target alone",
        description="Export the shipped small target and DFlash draft, run code-completion prompts one request at a "
        "time and all at once, with the draft and with the target alone, and print the outputs, the acceptance "
        "metrics and the speed-ups (all measured in this one run).",
    )
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--num-assistant-tokens", type=int, help="draft tokens verified per step (default: a full block)")
    p.add_argument("--prompt", action="append", help="replace the built-in prompts (repeatable)")
    p.add_argument("--tiny", action="store_true", help="use the random test pair instead of the trained one")
    add_runtime_arguments(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ovbuild.demo import run_demo
    from ovbuild.runtime.report import format_metrics

    check_runtime_arguments(args, with_draft=True)  # before the pair is exported
    demo = run_demo(args.prompt, args.max_new_tokens, args.tiny, runtime_options(args), args.num_assistant_tokens)
    for prompt, request in zip(demo.prompts, demo.concurrent.speculative, strict=True):
        print(f"--- request {request.id} ({len(request.generated)} tokens, {request.finish_reason})")
        print(prompt + request.text)
    for comparison in (demo.one_at_a_time, demo.concurrent):
        print(f"\n=== {comparison.name}, with the draft (speculative decoding)")
        print(format_metrics(comparison.speculative_metrics, with_draft=True))
        print(f"=== {comparison.name}, target alone")
        print(format_metrics(comparison.alone_metrics, with_draft=False))
    print(f"\noutputs identical with and without the draft: {'yes' if demo.identical else 'NO'}")
    for c in (demo.one_at_a_time, demo.concurrent):
        print(
            f"speed-up, {c.name}: {c.speedup:.2f}x ({c.speculative_metrics.tokens_per_second:.1f} vs "
            f"{c.alone_metrics.tokens_per_second:.1f} tokens/s)"
        )
    return 0 if demo.identical else 1

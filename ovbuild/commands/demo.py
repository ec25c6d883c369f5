"""`ovbuild demo`: the built-in pair end to end, with the draft and with the target alone."""

from __future__ import annotations

import argparse

from ovbuild.commands.generate import add_runtime_arguments, runtime_options


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "demo",
        help="export the built-in pair and compare speculative decoding with the target alone",
        description="Export the shipped small target and DFlash draft, run code-completion prompts as concurrent "
        "requests with the draft and with the target alone, and print the outputs, the acceptance metrics and the "
        "speed-up (both runs in this process, one after the other).",
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

    demo = run_demo(args.prompt, args.max_new_tokens, args.tiny, runtime_options(args), args.num_assistant_tokens)
    for prompt, request in zip(demo.prompts, demo.speculative, strict=True):
        print(f"--- request {request.id} ({len(request.generated)} tokens, {request.finish_reason})")
        print(prompt + request.text)
    print("\n=== with the draft (speculative decoding)")
    print(format_metrics(demo.speculative_metrics, with_draft=True))
    print("=== target alone")
    print(format_metrics(demo.alone_metrics, with_draft=False))
    print(f"\noutputs identical with and without the draft: {'yes' if demo.identical else 'NO'}")
    print(
        f"speed-up: {demo.speedup:.2f}x ({demo.speculative_metrics.tokens_per_second:.1f} vs "
        f"{demo.alone_metrics.tokens_per_second:.1f} tokens/s, {len(demo.prompts)} concurrent requests)"
    )
    return 0 if demo.identical else 1

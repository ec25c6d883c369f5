"""`ovbuild generate`: run prompts as concurrent requests on an exported target, with or without a draft."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ovbuild.errors import ConfigError


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "generate",
        help="generate text with speculative decoding (continuous batching)",
        description="Run prompts as concurrent requests on an exported target, with a draft "
        "(speculative decoding) or without (the target alone). Greedy by default, or sampling (--do-sample); "
        "lossless either way (in distribution when sampling).",
    )
    p.add_argument("--target", required=True, help="exported target folder")
    p.add_argument("--draft", help="exported draft folder (omit to run the target alone)")
    p.add_argument("--prompt", action="append", default=[], help="a prompt (repeat for concurrent requests)")
    p.add_argument(
        "--prompt-file",
        action="append",
        default=[],
        help="a file holding one prompt, or a JSON list of prompts (.json)",
    )
    add_runtime_arguments(p)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--num-assistant-tokens", type=int, help="draft tokens verified per step (default: a full block)")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    add_sampling_arguments(p)
    p.add_argument("--json", dest="json_path", help="write prompts, tokens, text and metrics to this file")
    p.add_argument("--trace", action="store_true", help="record every speculative step in the --json output")
    p.set_defaults(run=run)


def add_sampling_arguments(p: argparse.ArgumentParser) -> None:
    """Sampling options with OpenVINO GenAI's meanings (greedy unless --do-sample)."""
    p.add_argument("--do-sample", action="store_true", help="sample instead of greedy decoding")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (> 0)")
    p.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0 = off)")
    p.add_argument("--top-p", type=float, default=1.0, help="keep the smallest head of mass >= p (1 = off)")
    p.add_argument("--seed", type=int, default=0, help="random seed (rng_seed): same seed, same output")


def sampling_options(args: argparse.Namespace) -> dict:
    """GenerationConfig's sampling fields from the command line (checked there: one-line errors)."""
    return dict(
        do_sample=args.do_sample, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, rng_seed=args.seed
    )


def add_runtime_arguments(p: argparse.ArgumentParser) -> None:
    """Device and cache options shared by the commands that run models (defaults: exact target, fast draft)."""
    from ovbuild.runtime.pipeline import EXACT_TARGET, FAST_DRAFT

    precisions = ["u8", "f16", "bf16", "f32"]
    p.add_argument("--device", default="CPU", help="OpenVINO device (CPU, GPU, ...)")
    p.add_argument(
        "--kv-cache-precision",
        default=EXACT_TARGET.kv_cache_precision,
        choices=precisions,
        help="target KV cache precision (default f16: exact; u8 is smaller but not exactly lossless)",
    )
    p.add_argument(
        "--inference-precision",
        default=EXACT_TARGET.inference_precision,
        choices=["f32", "bf16", "f16"],
        help="target inference precision (default f32: exact)",
    )
    p.add_argument("--draft-kv-cache-precision", default=FAST_DRAFT.kv_cache_precision, choices=precisions)
    p.add_argument(
        "--draft-inference-precision",
        choices=["f32", "bf16", "f16"],
        help="draft inference precision (default: the device's own)",
    )
    p.add_argument("--cache-mb", type=float, default=EXACT_TARGET.cache_mb, help="target KV cache size in MB")
    p.add_argument("--draft-cache-mb", type=float, default=FAST_DRAFT.cache_mb, help="draft KV cache size in MB")
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument(
        "--confidence-threshold",
        type=float,
        default=0.0,
        help="DSpark: stop a proposal before the first row whose confidence is below this (0 = off)",
    )
    p.add_argument(
        "--markov-mode",
        choices=["chain", "lattice"],
        default="chain",
        help="DSpark: exact greedy chain (default) or the Top-K lattice walk",
    )


def runtime_options(args: argparse.Namespace):
    from ovbuild.runtime.pipeline import ModelOptions, RuntimeOptions

    target = ModelOptions(args.kv_cache_precision, args.inference_precision, args.cache_mb)
    draft = ModelOptions(args.draft_kv_cache_precision, args.draft_inference_precision, args.draft_cache_mb)
    # Only options the user set reach the drafter, so drafts of other families keep working with the defaults.
    draft_options = {}
    if args.confidence_threshold:
        draft_options["confidence_threshold"] = args.confidence_threshold
    if args.markov_mode != "chain":
        draft_options["markov_mode"] = args.markov_mode
    return RuntimeOptions(args.device, target, draft, args.max_num_batched_tokens, draft_options)


def read_prompts(args: argparse.Namespace) -> list[str]:
    prompts = list(args.prompt)
    for file in args.prompt_file:
        path = Path(file)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as e:
            raise ConfigError(f"{path}: cannot read prompt file ({e.strerror})") from e
        if path.suffix == ".json":
            try:
                data = json.loads(text)
            except json.JSONDecodeError as e:
                raise ConfigError(f"{path}: not valid JSON ({e})") from e
            if not isinstance(data, list) or not all(isinstance(s, str) for s in data):
                raise ConfigError(f"{path}: expected a JSON list of prompt strings")
            prompts += data
        else:
            prompts.append(text)
    if not prompts:
        raise ConfigError("no prompt given (use --prompt or --prompt-file)")
    return prompts


def run(args: argparse.Namespace) -> int:
    from ovbuild.runtime.pipeline import Pipeline
    from ovbuild.runtime.report import format_metrics, results_json
    from ovbuild.runtime.request import GenerationConfig

    prompts = read_prompts(args)
    GenerationConfig(**sampling_options(args))  # bad sampling values fail before any model loads
    pipeline = Pipeline(args.target, args.draft, runtime_options(args))
    stream = _Streamer(pipeline) if len(prompts) == 1 else None
    requests, metrics = pipeline.generate(
        prompts,
        args.max_new_tokens,
        args.num_assistant_tokens,
        tuple(args.stop),
        trace=args.trace,
        on_step=stream,
        **sampling_options(args),
    )
    if stream is None:
        for prompt, request in zip(prompts, requests, strict=True):
            print(f"--- request {request.id} ({request.finish_reason})\n{prompt}{request.text}")
    else:
        stream.finish(requests[0])
    print(format_metrics(metrics, with_draft=args.draft is not None), file=sys.stderr)
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(results_json(prompts, requests, metrics, args.trace), indent=2))
    return 0


class _Streamer:
    """Prints a single request's text as it grows."""

    def __init__(self, pipeline):
        self.pipeline, self.printed = pipeline, 0

    def __call__(self, scheduler) -> None:
        for request in scheduler.running:
            self._emit(self.pipeline.decode(request.generated))

    def finish(self, request) -> None:
        self._emit(request.text)
        print(flush=True)

    def _emit(self, text: str) -> None:
        if len(text) > self.printed:
            print(text[self.printed :], end="", flush=True)
            self.printed = len(text)

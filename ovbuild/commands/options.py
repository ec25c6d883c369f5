"""The options the commands that run models share (generate, serve, demo): device, caches, precisions, static rows,
the draft family's own options, sampling; turned into RuntimeOptions / GenerationConfig fields and checked in one place
(ovbuild.runtime.pipeline.check_options)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ovbuild.runtime.pipeline import RuntimeOptions

STATIC_ROWS = {"auto": None, "on": True, "off": False}  # --static-rows -> ModelOptions.static_rows


def add_sampling_arguments(p: argparse.ArgumentParser) -> None:
    """Sampling options and penalties with OpenVINO GenAI's meanings (greedy unless --do-sample)."""
    p.add_argument("--do-sample", action="store_true", help="sample instead of greedy decoding")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (> 0)")
    p.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0 = off)")
    p.add_argument("--top-p", type=float, default=1.0, help="keep the smallest head of mass >= p (1 = off)")
    p.add_argument("--seed", type=int, default=0, help="random seed (rng_seed): same seed, same output")
    p.add_argument(
        "--speculative-sampling",
        choices=["exact", "rejection"],
        default="exact",
        help="how sampled draft tokens are verified: exact (default: the target alone's tokens for the seed) or "
        "rejection (Leviathan et al.: same distribution, tokens depend on the draft length)",
    )
    p.add_argument(
        "--repetition-penalty",
        type=float,
        default=1.0,
        help="divide positive logits and multiply negative ones of tokens in the prompt or output by this (1 = off)",
    )
    p.add_argument(
        "--presence-penalty", type=float, default=0.0, help="subtract from the logit of every generated token (0 = off)"
    )
    p.add_argument(
        "--frequency-penalty",
        type=float,
        default=0.0,
        help="subtract this times its count from the logit of every generated token (0 = off)",
    )
    p.add_argument("--min-new-tokens", type=int, default=0, help="no EOS before this many tokens were generated")


def sampling_options(args: argparse.Namespace) -> dict:
    """GenerationConfig's sampling and penalty fields from the command line (checked there: one-line errors)."""
    return dict(
        do_sample=args.do_sample,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        rng_seed=args.seed,
        speculative_sampling=args.speculative_sampling,
        repetition_penalty=args.repetition_penalty,
        presence_penalty=args.presence_penalty,
        frequency_penalty=args.frequency_penalty,
        min_new_tokens=args.min_new_tokens,
    )


def add_runtime_arguments(p: argparse.ArgumentParser) -> None:
    """Device and cache options shared by the commands that run models (defaults: exact target, fast draft)."""
    from ovbuild.runtime.model.paged_model import INFERENCE_PRECISIONS, KV_PRECISIONS
    from ovbuild.runtime.pipeline import EXACT_TARGET, FAST_DRAFT
    from ovbuild.runtime.speculation.drafters import DRAFTER_OPTIONS

    p.add_argument("--device", default="CPU", help="OpenVINO device (CPU, GPU, ...)")
    p.add_argument(
        "--kv-cache-precision",
        default=EXACT_TARGET.kv_cache_precision,
        choices=KV_PRECISIONS,
        help="target KV cache precision (default f16; u8, keys quantized per token, is exact too and half the size)",
    )
    p.add_argument(
        "--inference-precision",
        default=EXACT_TARGET.inference_precision,
        choices=INFERENCE_PRECISIONS,
        help="target inference precision (default: bf16 on a CPU with AVX-512 bf16 units and no AMX, where it was "
        "measured exact and faster; elsewhere f32)",
    )
    p.add_argument("--draft-kv-cache-precision", default=FAST_DRAFT.kv_cache_precision, choices=KV_PRECISIONS)
    p.add_argument(
        "--draft-inference-precision",
        choices=INFERENCE_PRECISIONS,
        help="draft inference precision (default: f32 on a CPU without AMX, where a draft runs faster in it; "
        "elsewhere the device's own)",
    )
    p.add_argument(
        "--cache-mb",
        type=float,
        default=EXACT_TARGET.cache_mb,
        help="target cache size in MB (KV blocks; a hybrid target's linear-attention states take a share of it)",
    )
    p.add_argument("--draft-cache-mb", type=float, default=FAST_DRAFT.cache_mb, help="draft KV cache size in MB")
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="reuse the cached blocks of a prefix earlier requests computed (default: on)",
    )
    p.add_argument("--max-num-seqs", type=int, default=256, help="requests running at once, at most (default: 256)")
    p.add_argument(
        "--static-rows",
        choices=tuple(STATIC_ROWS),
        default="auto",
        help="run the calls of both models in copies compiled per row count, each holding its own weights (auto: on "
        "CPU for models with up to 32 MB of weights, where the demo pair served 1.1x to 1.4x faster)",
    )
    p.add_argument(
        "--recalibrate",
        action="store_true",
        help="time the draft-length planner's calibration calls again (its results are kept per model pair and "
        "machine in $OVBUILD_CACHE_DIR, else ~/.cache/ovbuild, and reused)",
    )
    p.add_argument(
        "--max-model-len",
        type=int,
        help="longest prompt + max_new_tokens served (default: the target's max_position_embeddings; only lowers it)",
    )
    for option in DRAFTER_OPTIONS:  # each draft family's own options, as its drafter declares them
        p.add_argument(
            "--" + option.name.replace("_", "-"),
            type=option.type,
            default=option.default,
            choices=option.choices,
            help=option.help,
        )


def runtime_options(args: argparse.Namespace) -> RuntimeOptions:
    """RuntimeOptions from the options of add_runtime_arguments."""
    from ovbuild.runtime.pipeline import ModelOptions, RuntimeOptions
    from ovbuild.runtime.speculation.drafters import DRAFTER_OPTIONS

    static = STATIC_ROWS[args.static_rows]
    target = ModelOptions(args.kv_cache_precision, args.inference_precision, args.cache_mb, static)
    draft = ModelOptions(args.draft_kv_cache_precision, args.draft_inference_precision, args.draft_cache_mb, static)
    # Only options set away from their defaults reach the drafter, so drafts of other families keep working.
    draft_options = {o.name: getattr(args, o.name) for o in DRAFTER_OPTIONS if getattr(args, o.name) != o.default}
    return RuntimeOptions(
        args.device,
        target,
        draft,
        args.max_num_batched_tokens,
        draft_options,
        max_model_len=args.max_model_len,
        enable_prefix_caching=args.enable_prefix_caching,
        max_num_seqs=args.max_num_seqs,
        recalibrate=args.recalibrate,
    )


# The command line's name of each runtime option, for check_options' messages (keyed as pipeline.OPTION_NAMES).
CLI_NAMES = {
    "static_rows": "--static-rows on",
    "target cache_mb": "--cache-mb",
    "draft cache_mb": "--draft-cache-mb",
    "target kv_cache_precision": "--kv-cache-precision",
    "draft kv_cache_precision": "--draft-kv-cache-precision",
    "max_model_len": "--max-model-len",
    "max_num_seqs": "--max-num-seqs",
}


def check_runtime_arguments(args: argparse.Namespace, with_draft: bool) -> None:
    """The options of add_runtime_arguments, checked before any model is read, by the checks Pipeline runs
    (pipeline.check_options), with messages naming the options."""
    from ovbuild.runtime.pipeline import check_options

    check_options(runtime_options(args), with_draft, CLI_NAMES)

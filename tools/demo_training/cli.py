"""The command line: arguments, defaults and the stages run in order."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from . import __doc__ as package_doc
from .checks import stage_check
from .common import log, read_json, write_json
from .corpus import stage_tokenizer
from .distill import stage_distill
from .evaluate import stage_eval
from .train_draft import stage_draft
from .train_target import stage_target

REPO = Path(__file__).resolve().parents[2]
STAGES = {  # in the order they run
    "tokenizer": stage_tokenizer,
    "target": stage_target,
    "distill": stage_distill,
    "draft": stage_draft,
    "eval": stage_eval,
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=package_doc.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "stages", nargs="*", metavar="STAGE", help=f"stages to run, in order: {', '.join(STAGES)} (default: all)"
    )
    p.add_argument("--check", action="store_true", help="run the equivalence checks on random models and exit")
    p.add_argument("--out", type=Path, default=REPO / "ovbuild" / "data" / "demo", help="checkpoint folder")
    p.add_argument("--work", type=Path, default=Path.home() / ".cache" / "ovbuild_train_demo", help="scratch")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    g = p.add_argument_group("geometry")
    g.add_argument("--vocab", type=int, default=4096)
    g.add_argument("--hidden", type=int, default=256)
    g.add_argument("--intermediate", type=int, default=512)
    g.add_argument("--layers", type=int, default=8)
    g.add_argument("--heads", type=int, default=4)
    g.add_argument("--kv-heads", type=int, default=2)
    g.add_argument("--head-dim", type=int, default=64)
    g.add_argument("--rope-theta", type=float, default=10000.0)
    g.add_argument("--draft-layers", type=int, default=2)
    g.add_argument("--num-taps", type=int, default=3)
    g.add_argument("--taps", type=int, nargs="+", help="target layers the draft reads (default: see grow.target_taps)")
    g.add_argument(
        "--grow-from",
        type=Path,
        help="a trained pair's folder (with target/ and draft/): the target starts as its target grown to --layers "
        "(its width; identity layers in between), the draft as its draft",
    )
    g.add_argument("--block-size", type=int, default=8)
    t = p.add_argument_group("training")
    t.add_argument("--seq-len", type=int, default=256)
    t.add_argument("--target-steps", type=int, default=600)
    t.add_argument("--target-batch", type=int, default=32)
    t.add_argument("--target-lr", type=float, default=2e-3)
    t.add_argument("--distill-seqs", type=int, default=6144)
    t.add_argument("--prompt-len", type=int, default=96)
    t.add_argument("--gen-len", type=int, default=160)
    t.add_argument("--gen-batch", type=int, default=128)
    t.add_argument("--draft-steps", type=int, default=2000)
    t.add_argument("--draft-batch", type=int, default=8)
    t.add_argument("--anchors", type=int, default=64, help="anchors per sequence per step")
    t.add_argument("--loss-decay", type=float, default=4.0, help="row j weighted exp(-(j-1)/decay)")
    t.add_argument("--draft-lr", type=float, default=2e-3)
    e = p.add_argument_group("evaluation")
    e.add_argument("--eval-prompts", type=int, default=96)
    e.add_argument("--eval-per-file", type=int, default=12)
    e.add_argument("--eval-prompt-len", type=int, default=64)
    e.add_argument("--eval-new", type=int, default=128)
    e.add_argument("--loop-ngram", type=int, default=16, help="a repeated n-gram marks a looping continuation")
    e.add_argument("--assistant-tokens", type=int, nargs="+", default=[3, 5, 7])
    args = p.parse_args(argv)
    unknown = set(args.stages) - set(STAGES)
    if unknown:
        p.error(f"unknown stage(s) {sorted(unknown)}; choose from {', '.join(STAGES)}")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    if args.check:
        stage_check(args)
        return
    args.work.mkdir(parents=True, exist_ok=True)
    timings_path = args.work / "timings.json"
    timings = read_json(timings_path) if timings_path.exists() else {}
    for stage in args.stages or STAGES:
        log(f"=== {stage}")
        t0 = time.time()
        STAGES[stage](args)
        timings[stage] = round(time.time() - t0, 1)
        write_json(timings_path, timings)
        log(f"=== {stage} done in {timings[stage]:.0f} s")
    write_json(args.work / "args.json", {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()})

"""Cost model at real scale: what one speculative step costs against one plain decode step, and the speed-up implied.

A random target shaped like Qwen3-4B and a draft shaped like z-lab/Qwen3-4B-DFlash-b16 (int8 weights by default) are
written locally and built. With n sequences of `--context` tokens each, the script times, side by side:
the target on 1 row per sequence (a plain decode step), the target on k+1 rows per sequence (verification), the draft
on its per-row call (tau context rows + one block per sequence), and the host time per scheduler step (Python
packing and verification, measured on the tiny pair at the same concurrency). It then prints the speed-up these
costs imply at published acceptance lengths tau (tokens per step):

    speed-up(tau) = tau * (target_1 + host_alone) / (target_k+1 + draft + host_spec)

    python bench/bench_cost_model.py [--weight-format int8] [--requests 1,4] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from ovbuild.graph.dflash import build_dflash_draft
from ovbuild.graph.target import build_target
from ovbuild.graph.weights import WeightPolicy
from ovbuild.runtime.drafters import BlockDrafter
from ovbuild.runtime.kv_cache import SequenceRows
from ovbuild.runtime.paged_model import PagedModel
from ovbuild.runtime.request import GenerationConfig
from ovbuild.runtime.scheduler import Scheduler
from ovbuild.testing import write_tiny_dflash, write_tiny_target
from ovbuild.weights.checkpoint import Checkpoint
from ovbuild.weights.families import load_draft
from ovbuild.weights.target import load_target

from shapes import QWEN3_4B_DFLASH_B16, write_draft, write_target

TAUS = (5.4, 3.1)  # DFlash on Qwen3-4B, GSM8K and MT-Bench (DSpark paper, table 1)


def timed(fn, repeats: int) -> float:
    """Median wall time of `repeats` calls, after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def target_call(model: PagedModel, n: int, past: int, rows: int, rng) -> None:
    """n sequences, each with `rows` new rows after `past` cached tokens (the cache is rolled back every call)."""
    seqs = [SequenceRows(s, past, rows) for s in range(n)]
    model.run(
        seqs,
        {
            "input_ids": rng.integers(0, 150000, n * rows),
            "position_ids": np.tile(np.arange(past, past + rows), n),
            "logits_indices": np.arange(n * rows, dtype=np.int64),
        },
    )


def draft_call(drafter: BlockDrafter, n: int, past: int, context_rows: int, width: int, rng) -> None:
    block = drafter.block_size
    rows = context_rows + block
    seqs = [SequenceRows(s, past, rows) for s in range(n)]
    tt = np.tile(np.r_[np.zeros(context_rows, np.int32), np.ones(block, np.int32)], n)
    candidates = np.concatenate([s * rows + context_rows + np.arange(1, block) for s in range(n)])
    drafter.model.run(
        seqs,
        {
            "input_ids": rng.integers(0, 150000, n * rows),
            "token_type_ids": tt,
            "hidden_states": rng.standard_normal((n * rows, width), np.float32),
            "position_ids": np.tile(np.arange(past, past + rows), n),
            "candidate_indices": candidates.astype(np.int64),
        },
    )


def prefill(model: PagedModel, n: int, past: int, rng, draft: bool = False, width: int = 0) -> None:
    """Fill the first `past` positions of every sequence once, so later calls attend over a real context."""
    seqs = [SequenceRows(s, 0, past) for s in range(n)]
    inputs = {"input_ids": rng.integers(0, 150000, n * past), "position_ids": np.tile(np.arange(past), n)}
    if draft:
        inputs |= {
            "token_type_ids": np.zeros(n * past, np.int32),
            "candidate_indices": np.zeros(0, np.int64),
            "hidden_states": rng.standard_normal((n * past, width), np.float32),
        }
    else:
        inputs["logits_indices"] = np.zeros(0, np.int64)
    model.run(seqs, inputs)


def host_per_step(n: int, with_draft: bool) -> float:
    """Host (Python) seconds per scheduler step at concurrency n, measured on the tiny pair."""
    with tempfile.TemporaryDirectory() as tmp:
        tcfg, tw = load_target(Checkpoint.open(write_tiny_target(Path(tmp) / "t")))
        dcfg, dw = load_draft(Checkpoint.open(write_tiny_dflash(Path(tmp) / "d")))
        target = PagedModel(build_target(tcfg, tw, dcfg.target_layer_ids))
        drafter = BlockDrafter(build_dflash_draft(dcfg, dw, tw)) if with_draft else None
        scheduler = Scheduler(target, drafter)
        for s in range(n):
            scheduler.add_request(list(range(s, s + 32)), GenerationConfig(max_new_tokens=48))
        scheduler.run()
        return scheduler.metrics.host_s / scheduler.metrics.steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--weight-format", default="int8")
    parser.add_argument("--requests", default="1,4")
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--tau-context", type=int, default=4, help="context rows per sequence in a draft call")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--target-precision", default="f32", help="target inference precision (f32 = exact)")
    parser.add_argument("--workdir", help="keep the random checkpoints here (default: a temporary folder)")
    args = parser.parse_args()
    root = Path(args.workdir or tempfile.mkdtemp(prefix="ovbuild_cost_"))
    rng = np.random.default_rng(0)
    try:
        start = time.perf_counter()
        if not (root / "target" / "config.json").exists():
            write_target(root / "target")
            write_draft(root / "draft")
        print(f"checkpoints ready in {time.perf_counter() - start:.0f} s ({root})", flush=True)
        policy = WeightPolicy(args.weight_format)
        tcfg, tw = load_target(Checkpoint.open(root / "target"))
        dcfg, dw = load_draft(Checkpoint.open(root / "draft"))
        start = time.perf_counter()
        target = PagedModel(
            build_target(tcfg, tw, dcfg.target_layer_ids, policy),
            kv_cache_precision="f16",
            inference_precision=args.target_precision,
            cache_mb=2048,
        )
        drafter = BlockDrafter(build_dflash_draft(dcfg, dw, tw, policy), cache_mb=1024)
        print(
            f"built and compiled in {time.perf_counter() - start:.0f} s (weights {args.weight_format}, target "
            f"{args.target_precision} math + f16 cache, draft default math + u8 cache)",
            flush=True,
        )
        k = QWEN3_4B_DFLASH_B16["dflash_config"]["block_size"] - 1
        width = dcfg.num_taps * dcfg.target_hidden_size
        print(
            f"\ncontext {args.context} tokens per sequence; verification k+1 = {k + 1} rows; draft call "
            f"{args.tau_context} context + {k + 1} block rows per sequence (milliseconds)"
        )
        header = f"{'n':>3} {'target 1':>9} {'target k+1':>10} {'draft':>7} {'host alone':>10} {'host spec':>9}"
        print(header + "".join(f" {'x at tau ' + str(t):>13}" for t in TAUS))
        for n in (int(x) for x in args.requests.split(",")):
            for s in range(n):
                target.cache.allocator.free(s)
                drafter.model.cache.allocator.free(s)
            prefill(target, n, args.context, rng)
            prefill(drafter.model, n, args.context, rng, draft=True, width=width)
            t1 = timed(lambda n=n: target_call(target, n, args.context, 1, rng), args.repeats)
            tk = timed(lambda n=n: target_call(target, n, args.context, k + 1, rng), args.repeats)
            td = timed(lambda n=n: draft_call(drafter, n, args.context, args.tau_context, width, rng), args.repeats)
            ha, hs = host_per_step(n, False), host_per_step(n, True)
            speedups = [tau * (t1 + ha) / (tk + td + hs) for tau in TAUS]
            print(
                f"{n:>3} {t1 * 1e3:>9.1f} {tk * 1e3:>10.1f} {td * 1e3:>7.1f} {ha * 1e3:>10.2f} {hs * 1e3:>9.2f}"
                + "".join(f" {s:>12.2f}x" for s in speedups),
                flush=True,
            )
    finally:
        if not args.workdir:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

"""A hybrid target's decode and verification calls at a Qwen3.6-like shape, and what its linear-attention states cost.

A random target shaped like bench/shapes.py's QWEN36_SCALED (Qwen3.6-27B's 3 linear : 1 full layer pattern and head
widths, scaled to fit this machine) is written locally and built. With n sequences of `--context` tokens each, the
calls are timed in interleaved rounds (the cache and the states are rolled back after each call):

  decode            1 row per sequence, its state reported (what the target alone runs)
  verify k          k + 1 rows per sequence, the states after every row reported (Q = k + 1 per sequence): what the
                    scheduler runs, so that the state of any accepted prefix can be kept
  verify k, 1 state the same rows with only the last row's states reported: the call without per-row states
  re-run j          j + 1 rows, 1 state: the second call the other design (run k + 1 rows, then re-run the j + 1
                    accepted ones from the saved state) would add per step

and the state memory per sequence slot and per verification call.

    python bench/bench_hybrid_calls.py [--weight-format int8] [--requests 1,4] [--context 512] [--k 3,7,15]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from ovbuild.graph.weights import WeightPolicy
from ovbuild.runtime.kv_cache import SequenceRows
from ovbuild.runtime.machine import describe
from ovbuild.runtime.paged_model import PagedModel
from ovbuild.runtime.state_pool import StatePool
from ovbuild.targets import build_paged_target, load_target
from ovbuild.weights.checkpoint import Checkpoint

from shapes import QWEN36_SCALED, write_hybrid_target


def call(model: PagedModel, n: int, past: int, rows: int, states: int, rng) -> float:
    """Seconds of one call: n sequences after `past` tokens, `rows` new rows each, states reported after the last
    `states` of them; nothing is kept, so the next call starts from the same cache and states."""
    seqs = [SequenceRows(s, past, rows) for s in range(n)]
    inputs = {
        "input_ids": rng.integers(0, 150000, n * rows),
        "position_ids": np.tile(np.arange(past, past + rows), n),
        "logits_indices": np.arange(n * rows, dtype=np.int64),
    }
    start = time.perf_counter()
    model.run(seqs, inputs, [list(range(rows - states, rows))] * n)
    return time.perf_counter() - start


def prefill(model: PagedModel, n: int, past: int, rng) -> None:
    """Every sequence's first `past` tokens, one at a time (bounded memory), their states kept."""
    for s in range(n):
        model.states.allocate(s)
        inputs = {
            "input_ids": rng.integers(0, 150000, past),
            "position_ids": np.arange(past),
            "logits_indices": np.zeros(0, np.int64),
        }
        model.run([SequenceRows(s, 0, past)], inputs)
        model.states.keep(s, past - 1)


def measure(model: PagedModel, n: int, args, rng) -> dict[str, tuple[int, list[float]]]:
    """Per call kind, (states reported per sequence, the seconds of every round); round 0 warms up and is dropped."""
    ks = [int(k) for k in args.k.split(",")]
    kinds = {"decode": (1, 1)}
    for k in ks:
        kinds[f"verify {k}"] = (k + 1, k + 1)
        kinds[f"verify {k}, 1 state"] = (k + 1, 1)
    for j in sorted({0, *(k // 2 for k in ks), *ks}):
        kinds.setdefault(f"re-run {j}", (j + 1, 1))
    times = {name: [] for name in kinds}
    for r in range(args.rounds + 1):
        for name, (rows, states) in kinds.items():
            seconds = call(model, n, args.context, rows, states, rng)
            if r:
                times[name].append(seconds)
    return {name: (kinds[name][1], seconds) for name, seconds in times.items()}


def report(n: int, times: dict[str, tuple[int, list[float]]], slot_bytes: int) -> None:
    decode = np.array(times["decode"][1])
    print(f"\nn = {n}: ms per call (median over rounds), its ratio to the same round's decode, states reported")
    for name, (states, seconds) in times.items():
        ratio = statistics.median(np.array(seconds) / decode)
        out = n * states * slot_bytes / 2**20
        print(f"  {name:<18} {statistics.median(seconds) * 1e3:8.1f} ms  x{ratio:5.2f}  {out:7.1f} MB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--weight-format", default="int8")
    parser.add_argument("--requests", default="1,4")
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--k", default="3,7,15", help="draft lengths verified (k + 1 rows per sequence)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--target-precision", default="f32", help="target inference precision (f32 = exact)")
    parser.add_argument("--workdir", help="keep the random checkpoint here (default: a temporary folder)")
    args = parser.parse_args()
    root = Path(args.workdir or tempfile.mkdtemp(prefix="ovbuild_hybrid_"))
    rng = np.random.default_rng(0)
    print(describe(), flush=True)
    try:
        start = time.perf_counter()
        if not (root / "target" / "config.json").exists():
            write_hybrid_target(root / "target")
        print(f"checkpoint ready in {time.perf_counter() - start:.0f} s ({root})", flush=True)
        cfg, weights = load_target(Checkpoint.open(root / "target"))
        start = time.perf_counter()
        model = PagedModel(
            build_paged_target(cfg, weights, (), WeightPolicy(args.weight_format)),
            kv_cache_precision="f16",
            inference_precision=args.target_precision,
            cache_mb=4096,
            state_slots=max(int(x) for x in args.requests.split(",")),
        )
        slot_bytes = StatePool.slot_bytes(model.states.specs)
        layers = QWEN36_SCALED["layer_types"]
        print(
            f"built and compiled in {time.perf_counter() - start:.0f} s: {layers.count('linear_attention')} linear + "
            f"{layers.count('full_attention')} full layers, weights {args.weight_format}, "
            f"{args.target_precision} math, f16 KV cache; states {slot_bytes / 2**20:.1f} MB per sequence; "
            f"context {args.context} tokens",
            flush=True,
        )
        for n in (int(x) for x in args.requests.split(",")):
            for s in range(n):
                model.free(s)
            prefill(model, n, args.context, rng)
            report(n, measure(model, n, args, rng), slot_bytes)
    finally:
        if not args.workdir:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

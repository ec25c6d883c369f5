"""Static row counts (ovbuild.runtime.static_rows) against the dynamic-shape model, on the shipped demo pair, side by
side in one process (rounds interleaved in shuffled order, the median of per-round ratios and their range).

1. Per call: the target's decode and verification calls as the scheduler makes them (each row a 1-row subsequence),
   f16 cache, at the target math ovbuild picks on this CPU; the draft's calls (context rows and a block).
2. Served: the demo prompts, 64 new tokens, the target alone and with the draft, one request at a time and 4, 16 and
   32 at once; every mode's tokens checked equal to its own target alone.
3. Memory: what each compiled copy adds to the process (resident set).

    python bench/bench_static_rows.py [--rounds 9] [--calls 20] [--concurrency 1 4 16 32]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

from ovbuild.demo import shipped_pair
from ovbuild.export import export
from ovbuild.graph.ir import read_ir
from ovbuild.runtime.drafters.base import DraftItem
from ovbuild.runtime.drafters.block import BlockDrafter
from ovbuild.runtime.kv_cache import SequenceRows
from ovbuild.runtime.machine import describe
from ovbuild.runtime.paged_model import PagedModel
from ovbuild.runtime.pipeline import EXACT_TARGET, FAST_DRAFT, ModelOptions, Pipeline, RuntimeOptions, target_precision

from bench_row_padding import export_pair
from bench_target_precision import call, per_call, serve_side_by_side, show_pairs

CONTEXT = 96  # cached tokens per sequence before every timed target call
# name: (sequences, rows per sequence)
TARGET_CALLS = {
    "decode 1 seq": (1, 1),
    "verify 1 seq x 5 rows": (1, 5),
    "decode 4 seq": (4, 1),
    "verify 4 seq x 5": (4, 5),
    "decode 16 seq": (16, 1),
    "decode 32 seq": (32, 1),
}
# name: (sequences, context rows, draft tokens), each sequence a fresh one
DRAFT_CALLS = {"1 seq, 3 context + 4 tokens": (1, 3, 4), "4 seq, 3 context + 4 tokens": (4, 3, 4)}


def resident_mb() -> float:
    """The process's resident set."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * 4096 / 2**20


def draft_call(drafter: BlockDrafter, sequences: int, context: int, tokens: int) -> None:
    """One draft call of fresh sequences: `context` rows of taps each and a block proposing `tokens` tokens."""
    taps = np.zeros((context, drafter.tap_width), np.float32)
    drafter.propose([DraftItem(100 + s, taps, 5, tokens) for s in range(sequences)])
    for s in range(sequences):
        drafter.free(100 + s)


def calls(target_dir: Path, draft_dir: Path, math: str | None, rounds: int, n_calls: int) -> None:
    model, draft_model = read_ir(target_dir), read_ir(draft_dir)
    rng = np.random.default_rng(0)
    cases = {}
    for mode, static in (("dynamic", False), ("static", True)):
        target = PagedModel(model, "CPU", "f16", math, num_blocks=32 * 8, static_rows=static)
        for s in range(32):
            feed = {"input_ids": rng.integers(2, 4000, CONTEXT), "position_ids": np.arange(CONTEXT)}
            target.run([SequenceRows(s, 0, CONTEXT)], feed | {"logits_indices": [CONTEXT - 1]})
        for name, shape in TARGET_CALLS.items():
            cases[(mode, name)] = lambda target=target, shape=shape: call(target, *shape, CONTEXT)
        drafter = BlockDrafter(
            draft_model, "CPU", FAST_DRAFT.kv_cache_precision, "f32", num_blocks=64, static_rows=static
        )
        for name, shape in DRAFT_CALLS.items():
            cases[(mode, name)] = lambda drafter=drafter, shape=shape: draft_call(drafter, *shape)
    times = per_call(cases, rounds, n_calls)
    variants = ("dynamic", "static")
    show_pairs(times, variants, list(TARGET_CALLS), f"demo target, {math or 'device default'} math, f16 cache")
    show_pairs(times, variants, list(DRAFT_CALLS), "demo draft, f32 math, u8 cache")


def served(target_dir: Path, draft_dir: Path, alone_dir: Path, rounds: int, concurrency: list[int]) -> None:
    """The demo pair served with and without static copies, alone and with the draft: time ratios to dynamic alone."""
    modes = {}
    for mode, static in (("dynamic", False), ("static", True)):
        target = ModelOptions(EXACT_TARGET.kv_cache_precision, None, EXACT_TARGET.cache_mb, static)
        draft = ModelOptions(FAST_DRAFT.kv_cache_precision, None, FAST_DRAFT.cache_mb, static)
        options = RuntimeOptions(target=target, draft=draft)
        modes[(mode, "alone")] = Pipeline(alone_dir, None, options)
        modes[(mode, "draft")] = Pipeline(target_dir, draft_dir, options)
    serve_side_by_side(modes, rounds, concurrency)


def memory(target_dir: Path, math: str | None) -> None:
    """Resident memory the dynamic model and each copy add, compiled one after the other."""
    model = read_ir(target_dir)
    before = resident_mb()
    target = PagedModel(model, "CPU", "f16", math, num_blocks=16, static_rows=True)
    print(f"\nmemory (demo target): dynamic model and its cache +{resident_mb() - before:.0f} MB", end="")
    for rows in (2, 8, 32):
        before = resident_mb()
        target.static.copy(rows)
        print(f", copy for {rows} rows +{resident_mb() - before:.0f} MB", end="")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 32])
    args = parser.parse_args()
    print(describe())
    math = target_precision(RuntimeOptions(), stateful=False)
    with tempfile.TemporaryDirectory(prefix="ovbuild_static_") as tmp:
        target_dir, draft_dir = export_pair(Path(tmp))
        memory(target_dir, math)
        calls(target_dir, draft_dir, math, args.rounds, args.calls)
        alone_dir = export(shipped_pair()[0], Path(tmp) / "alone", quiet=True).out  # no taps, as run without a draft
        served(target_dir, draft_dir, alone_dir, args.rounds, args.concurrency)


if __name__ == "__main__":
    main()

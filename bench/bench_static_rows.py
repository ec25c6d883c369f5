"""Static row counts (ovbuild.runtime.static_rows) against the dynamic-shape model, on the shipped demo pair, side by
side in one process (rounds interleaved in shuffled order, the median of per-round ratios and their range).

1. Per call: the target's decode and verification calls as the scheduler makes them (each row a 1-row subsequence),
   f16 cache, at the target math ovbuild picks on this CPU; the draft's calls (context rows and a block).
2. Served: the demo prompts, 64 new tokens, the target alone and with the draft, one request at a time and 4, 16 and
   32 at once; every mode's tokens checked equal to its own target alone.
3. Memory: what each compiled copy adds to the process (resident set).
4. Model size: random targets of growing width (8 layers, bf16 weights; hidden 256 is the demo target's shape), per
   call dynamic against static and what one copy adds to the process: whether copies pay beyond the size ovbuild
   makes them for (static_rows.MAX_WEIGHT_BYTES), and what they cost there.

    python bench/bench_static_rows.py [--rounds 9] [--calls 20] [--concurrency 1 4 16 32] [--widths 256 512 1024]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import openvino as ov

from ovbuild.demo import shipped_pair
from ovbuild.export import export
from ovbuild.ir import read_ir
from ovbuild.runtime.drafters.base import DraftItem
from ovbuild.runtime.drafters.block import BlockDrafter
from ovbuild.runtime.kv_cache import SequenceRows
from ovbuild.runtime.machine import describe
from ovbuild.runtime.paged_model import PagedModel
from ovbuild.runtime.pipeline import EXACT_TARGET, FAST_DRAFT, ModelOptions, Pipeline, RuntimeOptions, target_precision
from ovbuild.runtime.static_rows import weight_bytes
from ovbuild.testing import write_tiny_target

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
SIZE_CALLS = ["decode 1 seq", "verify 1 seq x 5 rows", "decode 4 seq"]  # the calls timed at every model size
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


def memory(model: ov.Model, math: str | None, label: str, rows: tuple[int, ...] = (2, 8, 32)) -> None:
    """Resident memory the dynamic model and each copy add, compiled one after the other."""
    before = resident_mb()
    target = PagedModel(model, "CPU", "f16", math, num_blocks=16, static_rows=True)
    print(f"\nmemory ({label}): dynamic model and its cache +{resident_mb() - before:.0f} MB", end="")
    for n in rows:
        before = resident_mb()
        target.static.copy(n)
        print(f", copy for {n} rows +{resident_mb() - before:.0f} MB", end="")
    print()


def sizes(folder: Path, math: str | None, widths: list[int], rounds: int, n_calls: int) -> None:
    """Random 8-layer targets of each hidden width (intermediate 2x, 64-wide heads, 2 query heads per KV head): per
    call dynamic / static, and the memory of a copy."""
    for hidden in widths:
        config = dict(num_hidden_layers=8, layer_types=["full_attention"] * 8, vocab_size=4096, head_dim=64)
        config |= dict(hidden_size=hidden, intermediate_size=2 * hidden)
        config |= dict(num_attention_heads=hidden // 64, num_key_value_heads=max(1, hidden // 128))
        source = write_tiny_target(folder / f"width{hidden}", dtype="bf16", **config)
        model = read_ir(export(source, folder / f"width{hidden}_ir", quiet=True).out)
        label = f"hidden {hidden}, {weight_bytes(model) / 2**20:.0f} MB of weights"
        memory(model, math, label, rows=(2,))
        cases = {}
        for mode, static in (("dynamic", False), ("static", True)):
            target = PagedModel(model, "CPU", "f16", math, num_blocks=4 * 8, static_rows=static)
            for s in range(4):
                feed = {"input_ids": np.arange(2, CONTEXT + 2), "position_ids": np.arange(CONTEXT)}
                target.run([SequenceRows(s, 0, CONTEXT)], feed | {"logits_indices": [CONTEXT - 1]})
            for name in SIZE_CALLS:
                cases[(mode, name)] = lambda target=target, shape=TARGET_CALLS[name]: call(target, *shape, CONTEXT)
        show_pairs(per_call(cases, rounds, n_calls), ("dynamic", "static"), SIZE_CALLS, label)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 32])
    parser.add_argument("--widths", type=int, nargs="*", default=[256, 512, 1024], help="hidden widths (none: skip)")
    args = parser.parse_args()
    print(describe())
    math = target_precision(RuntimeOptions(), stateful=False)
    with tempfile.TemporaryDirectory(prefix="ovbuild_static_") as tmp:
        target_dir, draft_dir = export_pair(Path(tmp))
        memory(read_ir(target_dir), math, "demo target")
        calls(target_dir, draft_dir, math, args.rounds, args.calls)
        alone_dir = export(shipped_pair()[0], Path(tmp) / "alone", quiet=True).out  # no taps, as run without a draft
        served(target_dir, draft_dir, alone_dir, args.rounds, args.concurrency)
        sizes(Path(tmp), math, args.widths, args.rounds, args.calls)


if __name__ == "__main__":
    main()

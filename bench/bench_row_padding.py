"""What a change of row count costs a call, and what row padding (ovbuild.runtime.padding) gives back.

1. The demo target: 1-row calls in a row, 6-row calls in a row, and the two alternating (every call a new row count).
2. The demo draft: calls of 3 context rows and a 5-row block in a row, and with 1 to 4 context rows in turn (what a
   draft call carries each step: the rows the last verification accepted), unpadded and padded.
3. Speculative decoding of the demo pair at pinned draft lengths, the draft padded and unpadded: draft time per step.

Every model here runs with dynamic shapes (static_rows off), the path of models too big for static copies: on CPU a
small model's calls run in copies compiled per row count instead (bench_static_rows.py), and padding is off there.

Side by side in one process, interleaved rounds in a new order each round, medians; ratios within rounds.

    python bench/bench_row_padding.py [--rounds 9] [--calls 60]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from ovbuild.demo import DEMO_PROMPTS, shipped_pair
from ovbuild.export import export
from ovbuild.ir import read_ir
from ovbuild.runtime.drafters.base import DraftItem
from ovbuild.runtime.drafters.block import BlockDrafter
from ovbuild.runtime.kv_cache import SequenceRows
from ovbuild.runtime.machine import describe
from ovbuild.runtime.padding import DRAFT_PADDING
from ovbuild.runtime.paged_model import DynamicExecutor, PagedModel
from ovbuild.runtime.pipeline import EXACT_TARGET, FAST_DRAFT, ModelOptions, Pipeline, RuntimeOptions
from ovbuild.runtime.request import GenerationConfig

CONTEXT = 48


def target_call(target: PagedModel, rows: int) -> float:
    """One call of `rows` rows after CONTEXT cached tokens of sequence 0."""
    feeds = {
        "input_ids": np.full(rows, 5),
        "position_ids": np.arange(CONTEXT, CONTEXT + rows),
        "logits_indices": np.arange(1),
    }
    start = time.perf_counter()
    target.run([SequenceRows(0, CONTEXT, rows)], feeds)
    return time.perf_counter() - start


def draft_call(drafter: BlockDrafter, context_rows: int) -> float:
    """One draft call of a scratch sequence: `context_rows` rows of taps and a block proposing 4 tokens."""
    item = DraftItem(7, np.zeros((context_rows, drafter.tap_width), np.float32), 5, 4)
    start = time.perf_counter()
    drafter.propose([item])
    seconds = time.perf_counter() - start
    drafter.free(7)
    return seconds


def export_pair(folder: Path) -> tuple[Path, Path]:
    """The shipped pair exported into `folder`: the target with the taps its draft reads, and the draft."""
    target_ckpt, draft_ckpt = shipped_pair()
    target_dir = export(target_ckpt, folder / "target", draft_of=draft_ckpt, quiet=True).out
    return target_dir, export(draft_ckpt, folder / "draft", target_model=target_ckpt, quiet=True).out


def demo_pair(folder: Path, static_rows: bool | None = None) -> tuple[PagedModel, Path, Path]:
    """The shipped pair exported into `folder` (export_pair): the target compiled with CONTEXT tokens of sequence 0
    cached (what target_call continues; static_rows as for PagedModel), and the target's and the draft's folders."""
    target_dir, draft_dir = export_pair(folder)
    target = PagedModel(read_ir(target_dir), "CPU", "f16", "f32", static_rows=static_rows)
    target.run([SequenceRows(0, 0, CONTEXT)], {"input_ids": np.full(CONTEXT, 5), "position_ids": np.arange(CONTEXT)})
    return target, target_dir, draft_dir


def rounds(cases: dict, n_rounds: int, rng: np.random.Generator) -> dict[str, list[float]]:
    """Median seconds per call of each case, per round (cases: name -> a function returning its calls' seconds)."""
    seconds = {name: [] for name in cases}
    for _ in range(n_rounds):
        for name in rng.permutation(list(cases)):
            seconds[name].append(statistics.median(cases[name]()))
    return seconds


def show(seconds: dict[str, list[float]], base: str) -> None:
    """Each case's median seconds per call and its speed against `base`, taken within rounds."""
    for name, values in seconds.items():
        ratio = statistics.median(b / v for b, v in zip(seconds[base], values, strict=True))
        print(f"  {name:<44} {statistics.median(values) * 1e3:7.3f} ms   {base} / this {ratio:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--calls", type=int, default=60)
    args = parser.parse_args()
    print(describe())
    rng = np.random.default_rng(0)
    calls = range(args.calls)
    with tempfile.TemporaryDirectory(prefix="ovbuild_padding_") as tmp:
        target, target_dir, draft_dir = demo_pair(Path(tmp), static_rows=False)
        print("\n1. demo target, 1 logits row per call:")
        cases = {
            "1 row, every call": lambda: [target_call(target, 1) for _ in calls],
            "6 rows, every call": lambda: [target_call(target, 6) for _ in calls],
            "1 and 6 rows in turn (the 1-row calls)": lambda: [target_call(target, 6 - 5 * (i % 2)) for i in calls][
                1::2
            ],
        }
        show(rounds(cases, args.rounds, rng), "1 row, every call")

        padded, unpadded = (BlockDrafter.from_folder(draft_dir, static_rows=False) for _ in range(2))
        unpadded.model.padding = None
        print(f"\n2. demo draft, a 5-row block per call (padding {DRAFT_PADDING}):")
        cases = {
            "3 context rows, every call": lambda: [draft_call(unpadded, 3) for _ in calls],
            "1 to 4 context rows in turn, unpadded": lambda: [draft_call(unpadded, 1 + i % 4) for i in calls],
            "1 to 4 context rows in turn, padded": lambda: [draft_call(padded, 1 + i % 4) for i in calls],
        }
        show(rounds(cases, args.rounds, rng), "3 context rows, every call")

        target_options = ModelOptions(EXACT_TARGET.kv_cache_precision, "f32", 256, static_rows=False)
        draft_options = ModelOptions(FAST_DRAFT.kv_cache_precision, None, FAST_DRAFT.cache_mb, static_rows=False)
        options = RuntimeOptions(target=target_options, draft=draft_options)
        pipelines = {
            "padded": Pipeline(target_dir, draft_dir, options),
            "unpadded": Pipeline(target_dir, draft_dir, options),
        }
        unpadded = pipelines["unpadded"].drafter.model
        unpadded.executor = DynamicExecutor(unpadded)
        prompts = [pipelines["padded"].encode(p) for p in DEMO_PROMPTS]

        def draft_per_step(pipeline: Pipeline, k: int) -> list[float]:
            per_step = []
            for prompt in prompts:
                scheduler = pipeline.scheduler()
                scheduler.add_request(prompt, GenerationConfig(64, num_assistant_tokens=k))
                scheduler.run()
                per_step.append(scheduler.metrics.draft_infer_s / scheduler.metrics.steps)
            return per_step

        print("\n3. speculative decoding of the demo pair, one request at a time, draft time per step:")
        for k in (3, 5, 7):
            cases = {f"k = {k}, draft {name}": (lambda p=p, k=k: draft_per_step(p, k)) for name, p in pipelines.items()}
            show(rounds(cases, args.rounds, rng), f"k = {k}, draft unpadded")


if __name__ == "__main__":
    main()

"""The target's math, f32 against bf16, per call: decode rows and verification rows as the scheduler runs them (each
row a 1-row subsequence), f16 KV cache, side by side in one process (rounds interleaved in shuffled order, the median
of per-round ratios).

On the shipped demo target, per call and in the pipeline (its prompts, 64 new tokens, the target alone and with the
draft, one request at a time and 4 and 16 at once; every mode's tokens checked equal to its own target alone), then
at Qwen/Qwen3-4B's shape (random weights written by bench/shapes.py): int8 weights
over all 36 layers, and the checkpoint's own bf16 weights over the first LAYERS layers (f32 math widens bf16 weights
to f32 when it compiles, which two full copies would not fit in this machine's memory). Both with the taps of
z-lab/Qwen3-4B-DFlash-b16 that fit, as a target exported for its draft has them.

    python bench/bench_target_precision.py [--rounds 9] [--calls 20] [--workdir DIR] [--skip-4b]
        [--concurrency 1 4 16]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from ovbuild.demo import shipped_pair
from ovbuild.export import export
from ovbuild.graph.weights import WeightPolicy
from ovbuild.ir import read_ir
from ovbuild.runtime.kv_cache import SequenceRows, sequence_rows
from ovbuild.runtime.machine import describe
from ovbuild.runtime.paged_model import PagedModel
from ovbuild.runtime.pipeline import EXACT_TARGET, ModelOptions, Pipeline, RuntimeOptions
from ovbuild.runtime.request import GenerationConfig
from ovbuild.targets import build_paged_target, load_target
from ovbuild.weights.checkpoint import Checkpoint

from bench_row_padding import export_pair
from bench_vs_genai import PROMPTS
from shapes import QWEN3_4B, write_target

CONTEXT = 256  # cached tokens per sequence before every timed call
LAYERS = 12  # of the bf16-weight Qwen3-4B shape
TAPS_4B = (1, 9, 17, 25, 33)  # z-lab/Qwen3-4B-DFlash-b16's target_layer_ids
# name: (sequences, rows per sequence)
CALLS = {"decode 1 seq": (1, 1), "verify 1 seq x 5 rows": (1, 5), "decode 4 seq": (4, 1), "verify 4 seq x 5": (4, 5)}


def compiled(model, math: str, sequences: int, vocab: int, rng) -> PagedModel:
    """The target in `math` with an f16 cache, `sequences` sequences of CONTEXT tokens cached."""
    target = PagedModel(model, "CPU", "f16", math, num_blocks=sequences * (CONTEXT // 16 + 4))
    for s in range(sequences):
        feed = {"input_ids": rng.integers(0, vocab, CONTEXT), "position_ids": np.arange(CONTEXT)}
        target.run([SequenceRows(s, 0, CONTEXT)], feed | {"logits_indices": [CONTEXT - 1]})
    return target


def call(target: PagedModel, sequences: int, rows: int, context: int = CONTEXT) -> None:
    """One call of `rows` new rows per sequence after `context` cached tokens, each row a 1-row subsequence as the
    scheduler verifies them (rolled back by the next call)."""
    layout = [part for s in range(sequences) for part in sequence_rows(s, context, rows, one_per_row=True)]
    n = sequences * rows
    feed = {"input_ids": [5] * n, "position_ids": [context + i for _ in range(sequences) for i in range(rows)]}
    target.run(layout, feed | {"logits_indices": list(range(n))})


def compare(label: str, model_of, vocab: int, rounds: int, calls: int) -> None:
    """f32 / bf16 time per call for every CALLS entry of the model model_of() builds (compiled twice from one build:
    the compiled models share its weights where they keep their precision)."""
    rng = np.random.default_rng(0)
    model = model_of()
    targets = {math: compiled(model, math, 4, vocab, rng) for math in ("f32", "bf16")}
    del model
    cases = {
        (math, name): (lambda t=t, shape=shape: call(t, *shape))
        for math, t in targets.items()
        for name, shape in CALLS.items()
    }
    show_pairs(per_call(cases, rounds, calls), ("f32", "bf16"), list(CALLS), label)


def per_call(cases: dict, rounds: int, calls: int) -> dict[object, list[float]]:
    """Median seconds per call of every case (key -> a function making one call), per round: rounds in shuffled
    order, after a round 0 that warms every shape up."""
    times = {key: [] for key in cases}
    for _ in range(rounds + 1):
        for key in random.sample(list(cases), len(cases)):
            seconds = []
            for _ in range(calls):
                start = time.perf_counter()
                cases[key]()
                seconds.append(time.perf_counter() - start)
            times[key].append(statistics.median(seconds))
    return {key: values[1:] for key, values in times.items()}


def show_pairs(times: dict, variants: tuple[str, str], names: list[str], title: str) -> None:
    """For each name, both variants' ms per call (median) and first / second time (median of per-round ratios)."""
    a, b = variants
    print(f"\n{title}: ms per call (median), {a} / {b} time (median of per-round ratios, min-max)")
    for name in names:
        first, second = times[(a, name)], times[(b, name)]
        ratios = [x / y for x, y in zip(first, second, strict=True)]
        ms = f"{a} {statistics.median(first) * 1e3:7.3f}  {b} {statistics.median(second) * 1e3:7.3f}"
        print(f"  {name:<28} {ms}  -> {statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})")


def serve_batches(pipeline: Pipeline, batches: list[list[list[int]]]) -> list[list[int]]:
    """Each batch served at once, 64 new tokens per request (EOS ignored); every request's tokens."""
    out = []
    for batch in batches:
        scheduler = pipeline.scheduler()
        requests = [scheduler.add_request(p, GenerationConfig(64)) for p in batch]
        scheduler.run()
        out += [r.generated for r in requests]
    return out


def pipelines(target_dir: Path, draft_dir: Path, alone_dir: Path, rounds: int, concurrency: list[int]) -> None:
    """The demo pair served at f32 and bf16 target math (f16 cache), alone and with the draft: time ratios to f32
    alone within each round."""
    modes = {}
    for math in ("f32", "bf16"):
        options = RuntimeOptions(target=ModelOptions(EXACT_TARGET.kv_cache_precision, math, EXACT_TARGET.cache_mb))
        modes[(math, "alone")] = Pipeline(alone_dir, None, options)
        modes[(math, "draft")] = Pipeline(target_dir, draft_dir, options)
    serve_side_by_side(modes, rounds, concurrency)


def serve_side_by_side(
    modes: dict[tuple[str, str], Pipeline], rounds: int, concurrency: list[int], warmups: int = 1
) -> dict[int, dict[tuple[str, str], list[float]]]:
    """Serve the demo prompts in every mode ((variant, "alone" or another label) -> pipeline) at each concurrency,
    rounds interleaved in shuffled order after `warmups` untimed runs of each mode; every mode's tokens must equal its
    variant's alone. Prints each mode's speed against the first variant's alone (median of per-round ratios), and how
    many requests the variants' alone runs agree on. Returns each concurrency's seconds per mode, one per round."""
    variants = list(dict.fromkeys(variant for variant, _ in modes))
    base = (variants[0], "alone")
    width, label_width = max(map(len, variants)), max(len(label) for _, label in modes)
    for pipeline in modes.values():  # every row count's copy now (static_rows): no timed run compiles one
        pipeline.compile_copies()
    measured = {}
    for n in concurrency:
        prompts = [modes[base].encode(p) for p in PROMPTS[: max(n, 4)]]
        batches = [prompts[:n]] if n > 1 else [[p] for p in prompts]
        serve = {mode: (lambda pipe=pipe, b=batches: serve_batches(pipe, b)) for mode, pipe in modes.items()}
        for _ in range(warmups):  # first-call shapes, the draft's cost calibration, the planner's back-off
            for run in serve.values():
                run()
        expected = {variant: serve[(variant, "alone")]() for variant in variants}
        agree = sum(len(set(map(tuple, requests))) == 1 for requests in zip(*expected.values(), strict=True))
        seconds = {mode: [] for mode in modes}
        for _ in range(rounds):
            for mode in random.sample(list(modes), len(modes)):
                start = time.perf_counter()
                tokens = serve[mode]()
                seconds[mode].append(time.perf_counter() - start)
                if tokens != expected[mode[0]]:
                    raise SystemExit(f"{mode}: tokens differ from {mode[0]} alone")
        label = "one request at a time" if n == 1 else f"{n} requests at once"
        print(f"\ndemo pair, {label}: {base[0]} alone time / mode time (median of per-round ratios, min-max)")
        if len(variants) > 1:
            print(f"  ({' and '.join(variants)} alone gave the same tokens in {agree} of {len(prompts)} requests)")
        for mode, times in seconds.items():
            ratios = [b / t for b, t in zip(seconds[base], times, strict=True)]
            spread = f"({min(ratios):.2f}-{max(ratios):.2f})"
            print(f"  {mode[0]:>{width}} {mode[1]:<{label_width}} {statistics.median(ratios):.2f}x {spread}")
        measured[n] = seconds
    return measured


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--workdir", help="keep the random Qwen3-4B-shaped checkpoints here")
    parser.add_argument("--skip-4b", action="store_true", help="the demo pair only")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    args = parser.parse_args()
    print(describe())
    with tempfile.TemporaryDirectory(prefix="ovbuild_precision_") as tmp:
        target_dir, draft_dir = export_pair(Path(tmp))
        compare("demo target (with its draft's taps)", lambda: read_ir(target_dir), 4000, args.rounds, args.calls)
        alone_dir = export(shipped_pair()[0], Path(tmp) / "alone", quiet=True).out  # no taps, as run without a draft
        pipelines(target_dir, draft_dir, alone_dir, args.rounds, args.concurrency)
        if args.skip_4b:
            return
        root = Path(args.workdir or tmp)
        shapes = {
            "int8": ({}, TAPS_4B),
            "keep": ({"num_hidden_layers": LAYERS, "layer_types": ["full_attention"] * LAYERS}, (1, 5, 9)),
        }
        for fmt, (override, taps) in shapes.items():
            folder = root / f"qwen3-4b-{fmt}"
            if not (folder / "config.json").exists():
                write_target(folder, {**QWEN3_4B, **override})
            cfg, weights = load_target(Checkpoint.open(folder))
            layers = cfg.num_layers
            compare(
                f"Qwen3-4B shape, {layers} layers, {'bf16' if fmt == 'keep' else fmt} weights",
                lambda cfg=cfg, weights=weights, taps=taps, fmt=fmt: build_paged_target(
                    cfg, weights, taps, WeightPolicy(fmt)
                ),
                cfg.vocab_size,
                args.rounds,
                args.calls,
            )


if __name__ == "__main__":
    main()

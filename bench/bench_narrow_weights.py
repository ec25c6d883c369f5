"""What keeping bf16 weights narrow saves (ovbuild.runtime.narrow_weights): a target compiled with its weights' Converts
marked as decompression, against the same target with them widened to f32 first (the plugin's fold, as before). Under
f32 math the narrow way is the one a machine too small for the widened weights gets.

1. Memory: each way in a fresh process (the model compiled, its static copies if it has them, a call of each size
   made), the resident anonymous memory and the peak.
2. Per call: both ways in one process, verification-shaped calls (1-row subsequences) of 1, 4, 8 and 32 rows after
   64 cached tokens, alternating call by call in a new order each time; median per round, ratios within rounds. The
   two are compiled and timed twice, in either order (the second compiled ran faster, whichever it was).
   Before timing, each size's logits of the two are compared (bitwise, or their NMSE).

Shapes: `demo` is the shipped demo target with the draft's taps (static copies); `qwen3-4b` is Qwen3-4B's width and
vocabulary with `--layers` layers of random bf16 weights (dynamic: too big for copies), kept in `--workdir`.

    python bench/bench_narrow_weights.py [--shape demo|qwen3-4b] [--layers 4] [--inference-precision bf16]
        [--rounds 9] [--calls 30] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from unittest import mock

import numpy as np

from ovbuild.demo import shipped_pair
from ovbuild.families import load_draft
from ovbuild.runtime import narrow_weights, paged_model
from ovbuild.runtime.kv_cache import SequenceRows
from ovbuild.runtime.machine import describe
from ovbuild.runtime.paged_model import PagedModel
from ovbuild.targets import build_paged_target, load_target
from ovbuild.weights.checkpoint import Checkpoint

from shapes import QWEN3_4B, write_target

CONTEXT = 64
ROWS = (1, 4, 8, 32)
WAYS = ("narrow", "widened")


def target_ir(shape: str, layers: int, workdir: Path):
    """(the target IR, what must stay alive while it compiles: its Constants share the checkpoint's mapped file)."""
    if shape == "demo":
        target, draft = shipped_pair()
        taps = load_draft(Checkpoint.open(draft))[0].target_layer_ids
    else:
        target, taps = workdir / f"qwen3-4b-{layers}", ()
        if not (target / "config.json").exists():
            write_target(target, {**QWEN3_4B, "num_hidden_layers": layers, "layer_types": ["full_attention"] * layers})
    cfg, weights = load_target(Checkpoint.open(target))
    return build_paged_target(cfg, weights, taps), weights


def compiled(model, way: str, precision: str) -> PagedModel:
    """The target compiled `way`: "widened" compiles it as ovbuild did before, every Convert left to the plugin."""
    with ExitStack() as stack:
        if way == "widened":
            stack.enter_context(mock.patch.object(paged_model, "narrow_weights", lambda m, device, hint: m))
        else:  # under f32 math, as on a machine too small for them widened
            stack.enter_context(mock.patch.object(narrow_weights, "physical_memory_mb", lambda: 1.0))
        target = PagedModel(model, kv_cache_precision="f16", inference_precision=precision, cache_mb=512)
        target.compile_copies()
    target.run(
        [SequenceRows(0, 0, CONTEXT)], {"input_ids": np.arange(CONTEXT) % 97 + 3, "position_ids": np.arange(CONTEXT)}
    )
    return target


def verify_call(target: PagedModel, rows: int) -> np.ndarray:
    """One verification-shaped call of `rows` rows after CONTEXT cached tokens (rolled back by the next); its logits."""
    feeds = {
        "input_ids": np.arange(rows) + 7,
        "position_ids": np.arange(CONTEXT, CONTEXT + rows),
        "logits_indices": np.arange(rows),
    }
    return target.run([SequenceRows(0, CONTEXT + i, 1) for i in range(rows)], feeds)["logits"]


def memory(args) -> None:
    """Child process: compile one way, call once per size, print the memory as JSON."""
    model, keep = target_ir(args.shape, args.layers, Path(args.workdir))
    base = resident()
    target = compiled(model, args.memory_of, args.inference_precision)
    for rows in ROWS:
        verify_call(target, rows)
    after = resident()
    print(json.dumps({"anon_mb": after["RssAnon"] - base["RssAnon"], "peak_mb": after["VmHWM"]}))
    del keep


def resident() -> dict[str, float]:
    """The process's resident anonymous memory and peak resident set, MB."""
    lines = Path("/proc/self/status").read_text().splitlines()
    fields = {line.split(":")[0]: line.split()[1:2] for line in lines}
    return {key: int(fields[key][0]) / 1024 for key in ("RssAnon", "VmHWM")}


def per_call(args) -> None:
    """Both ways compiled, their logits compared, then timed; twice, compiled in one order and then the other: the
    model compiled second ran 3% to 5% faster either way on the demo target, whatever its weights."""
    model, keep = target_ir(args.shape, args.layers, Path(args.workdir))
    rng = np.random.default_rng(0)
    for order in (WAYS, WAYS[::-1]):
        # clones: the static copies of models compiled alike from one caller's model are shared (static_rows._SHARED)
        targets = {way: compiled(model.clone(), way, args.inference_precision) for way in order}
        if order == WAYS:
            for rows in ROWS:
                a, b = (verify_call(targets[way], rows).copy() for way in WAYS)
                same = "bitwise equal" if np.array_equal(a, b) else f"NMSE {np.mean((a - b) ** 2) / np.mean(b**2):.1e}"
                print(f"logits of {rows} rows, narrow against widened: {same}")
        print(
            f"per call, widened / narrow, {order[0]} compiled first (median over rounds of each round's median call):"
        )
        for rows in ROWS:
            time_calls(targets, rows, args.rounds, args.calls, rng)
        del targets
    del keep


def time_calls(
    targets: dict[str, PagedModel], rows: int, n_rounds: int, n_calls: int, rng: np.random.Generator
) -> None:
    """Print both ways' median call of `rows` rows and their ratio within rounds, calls alternating in a new order."""
    seconds = {way: [] for way in WAYS}
    for _ in range(n_rounds):
        calls = {way: [] for way in WAYS}
        for _ in range(n_calls):
            for way in rng.permutation(WAYS):
                start = time.perf_counter()
                verify_call(targets[way], rows)
                calls[way].append(time.perf_counter() - start)
        for way in WAYS:
            seconds[way].append(statistics.median(calls[way]))
    ratios = [w / n for w, n in zip(seconds["widened"], seconds["narrow"], strict=True)]
    print(
        f"  {rows:2d} rows: widened {statistics.median(seconds['widened']) * 1e3:.2f} ms, narrow "
        f"{statistics.median(seconds['narrow']) * 1e3:.2f} ms, ratio {statistics.median(ratios):.2f}x "
        f"(rounds {min(ratios):.2f}-{max(ratios):.2f})",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="demo", choices=("demo", "qwen3-4b"))
    parser.add_argument("--layers", type=int, default=4, help="qwen3-4b: layers of the random target")
    parser.add_argument("--inference-precision", default="bf16", choices=("f32", "bf16"), help="the target's math")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--workdir", help="keep the random checkpoint here (default: a temporary folder)")
    parser.add_argument("--memory-of", choices=WAYS, help=argparse.SUPPRESS)  # the child process of step 1
    args = parser.parse_args()
    if args.memory_of:
        return memory(args)
    print(describe())
    with tempfile.TemporaryDirectory(prefix="ovbuild_narrow_") as tmp:
        args.workdir = args.workdir or tmp
        print(f"{args.shape} target, {args.inference_precision} math, f16 cache")
        for way in WAYS:
            command = [sys.executable, __file__, *sys.argv[1:], "--workdir", args.workdir, "--memory-of", way]
            figures = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
            print(
                f"memory, {way}: +{figures['anon_mb']:.0f} MB anonymous, peak {figures['peak_mb']:.0f} MB", flush=True
            )
        per_call(args)


if __name__ == "__main__":
    main()

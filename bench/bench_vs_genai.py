"""ovbuild against stock OpenVINO GenAI, side by side in one process, on the shipped demo pair exported both ways from
the same weights (paged for ovbuild, --format genai for GenAI).

Modes, one request at a time: ovbuild target alone (exported without taps, as one runs it without a draft), ovbuild with
the draft (adaptive draft length), GenAI `LLMPipeline` alone and with its DFlash `draft_model`. With 4, 16 and 32
requests at once: ovbuild alone and with the draft, GenAI `ContinuousBatchingPipeline` alone (GenAI's DFlash path serves
one request at a time). Both ways ovbuild alone also runs a second time, an A/A control: its ratio to the first shows
how far the machine alone moves a ratio. Every round runs every mode once, interleaved in a new random order each round;
each ratio is taken within a round and the median over rounds is printed with its spread. Every mode's tokens must equal
ovbuild's target alone (greedy; EOS ignored so that all run the same length).
Both sides run the same inference and KV cache precisions: f32 by default, where the two implementations agree token
for token. With `--inference-precision bf16` (ovbuild's default target math on a CPU with AVX-512 bf16 and no AMX)
ovbuild's draft must still equal ovbuild's alone; GenAI's modes compute in bf16 otherwise than ovbuild does, so their
requests equal to ovbuild's alone are counted instead.

One request at a time it prints the speculation floor: for each pinned draft length k, its mean acceptance
length tau_k times t_alone(1 row) / (t_target(k + 1 rows) + t_draft(tau_k + k + 1 rows) + t_host), each call time the
fastest of the recent calls the runtime made with about that many rows (CallCost.fastest), host the per-step average of
a step with a draft call; the best k is the most speculation could give on this pair and machine, and the measured ratio
is set against it. Minima flatter the floor on a shared machine, so next to it stands what each pinned k measured:
every prompt run with it and alone in turn (order alternating), the ratio of the summed times. Every static copy
(ovbuild.runtime.model.static_rows) is compiled before anything is timed.

    python bench/bench_vs_genai.py [--rounds 5] [--new-tokens 64] [--concurrency 1 4 16 32]
        [--inference-precision f32|bf16]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from itertools import zip_longest
from pathlib import Path

import numpy as np
import openvino as ov
import openvino_genai as genai

from ovbuild.demo import DEMO_PROMPTS, export_pair, shipped_pair
from ovbuild.export import export
from ovbuild.runtime.cache.kv_cache import SequenceRows
from ovbuild.runtime.model.paged_model import PagedModel
from ovbuild.runtime.pipeline import EXACT_TARGET, ModelOptions, Pipeline, RuntimeOptions
from ovbuild.runtime.request import GenerationConfig

import harness

# Starts of Python code like the demo target's training text (standard-library style); the first four are the demo's.
PROMPTS = [
    *DEMO_PROMPTS,
    "import os\n\n\ndef walk(top):\n",
    "    def __repr__(self):\n        return ",
    "def read_lines(path):\n    with open(path) as f:\n",
    "class Queue:\n    def put(self, item):\n",
    "    for key, value in items:\n        ",
    "def parse_args(argv=None):\n",
    "    if not isinstance(value, str):\n        raise ",
    "import re\n\n_pattern = re.compile(",
    "    def __len__(self):\n",
    "class Error(Exception):\n    ",
    "def copy(src, dst):\n    ",
    "    try:\n        return self._cache[key]\n",
    "def main():\n    parser = ",
    "    @property\n    def name(self):\n",
    "class Node:\n    def __init__(self, value, next=None):\n",
    "    def __iter__(self):\n        ",
    "def split(s, sep=None):\n",
    "    with self._lock:\n        ",
    "def encode(data, encoding='utf-8'):\n",
    "    def write(self, data):\n        ",
    "import sys\n\n\ndef usage():\n",
    "    except OSError as e:\n        ",
    "def join(*paths):\n",
    "    def keys(self):\n        return ",
    "class Counter(dict):\n",
    "    def clear(self):\n        ",
    "def escape(s):\n    ",
    "    while self._queue:\n        ",
]


def scheduler_config() -> genai.SchedulerConfig:
    s = genai.SchedulerConfig()
    s.enable_prefix_caching = False  # GenAI's DFlash pipeline refuses it; off for every GenAI mode alike
    s.cache_size = 1  # GB
    return s


class Modes:
    """Every mode: a function running a list of prompts (token ids) and returning their tokens."""

    def __init__(
        self,
        paged: tuple[Path, Path, Path],
        genai_dirs: tuple[Path, Path],
        kv: str,
        new_tokens: int,
        block: int,
        math: str = "f32",
    ):
        """paged: the target exported for its draft (with taps), the draft, and the target exported alone; math: the
        targets' inference precision on both sides."""
        self.new_tokens = new_tokens
        options = RuntimeOptions(target=ModelOptions(kv, math, EXACT_TARGET.cache_mb))
        self.pipeline = Pipeline(*paged[:2], options)
        # "alone" is what a user without a draft runs: the target exported without taps, which cost about 10% of a
        # 1-row call of this small target
        self.alone = Pipeline(paged[2], None, options)
        props = {"INFERENCE_PRECISION_HINT": math, "KV_CACHE_PRECISION": kv}
        self.llm = genai.LLMPipeline(str(genai_dirs[0]), "CPU", scheduler_config=scheduler_config(), **props)
        draft = genai.draft_model(str(genai_dirs[1]), "CPU", INFERENCE_PRECISION_HINT="f32")
        self.dflash = genai.LLMPipeline(
            str(genai_dirs[0]), "CPU", draft_model=draft, scheduler_config=scheduler_config(), **props
        )
        self.cb = genai.ContinuousBatchingPipeline(str(genai_dirs[0]), scheduler_config(), "CPU", props)
        self.config = genai.GenerationConfig()
        self.config.max_new_tokens, self.config.ignore_eos = new_tokens, True
        self.draft_config = genai.GenerationConfig()
        self.draft_config.max_new_tokens, self.draft_config.ignore_eos = new_tokens, True
        self.draft_config.num_assistant_tokens = block - 1  # the trained block (GenAI's default is 5)
        self.last_metrics = None
        self.draft_lengths: list[int] = []  # decode steps that drafted 0, 1, 2, ... tokens, summed over runs

    def runs(self, prompts: list[list[int]], concurrent: bool) -> dict:
        """The modes to compare for these prompts, by name: one request at a time or all at once."""
        runs = {
            "ovbuild alone": lambda: self.ovbuild(prompts, False, concurrent),
            # the same mode twice: its ratio to the first shows how far this machine moves a ratio by itself
            "ovbuild alone (A/A)": lambda: self.ovbuild(prompts, False, concurrent),
            "ovbuild draft": lambda: self.ovbuild(prompts, True, concurrent),
        }
        if concurrent:
            runs["GenAI CB"] = lambda: self.genai_cb(prompts)
        else:
            runs["GenAI LLMPipeline"] = lambda: self.genai_llm(prompts, False)
            runs["GenAI DFlash"] = lambda: self.genai_llm(prompts, True)
        return runs

    def ovbuild(
        self, prompts: list[list[int]], use_draft: bool, concurrent: bool, k: int | None = None
    ) -> list[list[int]]:
        batches = [prompts] if concurrent else [[p] for p in prompts]
        out = []
        for batch in batches:
            scheduler = self.pipeline.scheduler() if use_draft else self.alone.scheduler()
            config = GenerationConfig(self.new_tokens, num_assistant_tokens=k)
            requests = [scheduler.add_request(p, config) for p in batch]
            scheduler.run()
            out += [r.generated for r in requests]
            self.last_metrics = scheduler.metrics
            self.draft_lengths = _add(self.draft_lengths, scheduler.metrics.requests.draft_length_histogram)
        return out

    def genai_llm(self, prompts: list[list[int]], use_draft: bool) -> list[list[int]]:
        pipe, config = (self.dflash, self.draft_config) if use_draft else (self.llm, self.config)
        return [list(pipe.generate(ov.Tensor(np.array([p], np.int64)), config).tokens[0]) for p in prompts]

    def genai_cb(self, prompts: list[list[int]]) -> list[list[int]]:
        tensors = [ov.Tensor(np.array([p], np.int64)) for p in prompts]
        results = self.cb.generate(tensors, [self.config] * len(prompts))
        return [list(r.m_generation_ids[0]) for r in results]


def _add(a: list[int], b: list[int]) -> list[int]:
    """Two histograms added bin by bin."""
    return [x + y for x, y in zip_longest(a, b, fillvalue=0)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 32])
    parser.add_argument("--kv-cache-precision", default=EXACT_TARGET.kv_cache_precision)
    parser.add_argument("--inference-precision", default="f32", choices=("f32", "bf16"), help="the targets' math")
    parser.add_argument("--plot", type=Path, help="also draw the speed-ups against requests as a PNG at this path")
    harness.add_arguments(parser, rounds=5)
    args = parser.parse_args()
    speedups: dict[str, dict[int, harness.Ratio]] = {}  # series -> requests -> ratio, for --plot
    harness.start("ovbuild against stock OpenVINO GenAI on the shipped demo pair, side by side")
    with tempfile.TemporaryDirectory(prefix="ovbuild_vs_genai_") as tmp:
        tmp = Path(tmp)
        target_ckpt, draft_ckpt = shipped_pair()
        paged = (
            *export_pair(target_ckpt, draft_ckpt, tmp / "paged"),
            export(target_ckpt, tmp / "paged" / "alone", quiet=True).out,  # untapped, as one serves it alone
        )
        genai_dirs = (
            export(target_ckpt, tmp / "genai" / "target", format="genai", quiet=True).out,
            export(draft_ckpt, tmp / "genai" / "draft", target_model=target_ckpt, format="genai", quiet=True).out,
        )
        block = int(json.loads((draft_ckpt / "config.json").read_text())["block_size"])
        modes = Modes(paged, genai_dirs, args.kv_cache_precision, args.new_tokens, block, args.inference_precision)
        for pipeline in (modes.pipeline, modes.alone):  # every row count's copy now: no timed run compiles one
            pipeline.compile_copies()
        encode = modes.pipeline.encode
        print(
            f"demo pair, {args.new_tokens} new tokens per request (EOS ignored), {args.inference_precision} "
            "inference, "
            f"{args.kv_cache_precision} KV cache on both sides, {args.rounds} rounds interleaved"
        )
        for n in args.concurrency:
            prompts = [encode(p) for p in PROMPTS[:n]] if n > 1 else [encode(p) for p in PROMPTS[:4]]
            runs = modes.runs(prompts, concurrent=n > 1)
            reference = runs["ovbuild alone"]()
            equal: dict[str, list[int]] = {}  # GenAI modes at other than f32: requests equal to ovbuild's alone

            def check(name: str, tokens: list[list[int]], reference=reference, equal=equal) -> None:
                same = sum(a == b for a, b in zip(tokens, reference, strict=True))
                if name.startswith("GenAI") and args.inference_precision != "f32":
                    equal.setdefault(name, []).append(same)
                elif tokens != reference:
                    raise harness.OutputsDiffer(f"{name}: {same}/{len(tokens)} requests equal ovbuild's target alone")

            modes.draft_lengths = []
            rounds = harness.interleave(runs, args.rounds, seed=args.seed + n, check=check)
            report(n, len(prompts), args.new_tokens, rounds)
            genai = "GenAI LLMPipeline" if n == 1 else "GenAI CB"
            for series, (a, b) in {
                "ovbuild with the draft / GenAI alone": ("ovbuild draft", genai),
                "ovbuild alone / GenAI alone": ("ovbuild alone", genai),
                "GenAI's DFlash / GenAI alone": ("GenAI DFlash", genai),
                "ovbuild with the draft / ovbuild alone": ("ovbuild draft", "ovbuild alone"),
            }.items():
                if a in rounds.seconds:
                    speedups.setdefault(series, {})[n] = rounds.ratio(b, a)  # speed a / speed b
            for name, counts in equal.items():
                print(f"    {name}: {min(counts)}-{max(counts)} of {len(prompts)} requests equal to ovbuild's alone")
            print(
                f"    ovbuild draft lengths chosen (all rounds, decode steps drafting 0, 1, ...): {modes.draft_lengths}"
            )
            if n == 1:
                print_floor(modes, prompts, block, rounds.ratio("ovbuild alone", "ovbuild draft").median)
        if args.plot is not None:
            title = f"the shipped demo pair, {args.inference_precision} math: speed against GenAI alone, side by side"
            harness.plot_speedups(args.plot, title, "requests at once", speedups, harness.machine_line())
            print(f"plot: {args.plot}")


def fastest_decode_call(target: PagedModel, context: int = 16, calls: int = 50) -> float:
    """The fastest of `calls` 1-row calls of `target` after `context` cached tokens (a scratch sequence, freed)."""
    scratch = -1
    feed = {"input_ids": np.full(context, 5, np.int64), "position_ids": np.arange(context)}
    target.run([SequenceRows(scratch, 0, context)], feed | {"logits_indices": np.array([context - 1])})
    step = {"input_ids": np.array([5]), "position_ids": np.array([context]), "logits_indices": np.array([0])}
    seconds = []
    for _ in range(calls):
        start = time.perf_counter()
        target.run([SequenceRows(scratch, context, 1)], step)
        seconds.append(time.perf_counter() - start)
    target.free(scratch)
    return min(seconds)


def print_floor(modes: Modes, prompts: list[list[int]], block: int, measured: float) -> None:
    """The floor of speculation one request at a time, per pinned k, from the runtime's own cost models, and what
    each pinned k measured against the target alone."""
    spec = modes.pipeline.speculation
    print("  floor, one request at a time (tau_k x t_alone(1) / (t_T(k+1) + t_D(tau_k+k+1) + t_host)):")
    t1 = fastest_decode_call(modes.alone.target)
    best, best_pinned = (0.0, 0), (0.0, 0)
    for k in range(1, block):
        runs, seconds = [], {"alone": 0.0, "pinned": 0.0}  # every prompt's totals at this k; both modes' times
        for i, p in enumerate(prompts):
            order = [("alone", False), ("pinned", True)][:: 1 if i % 2 else -1]
            tokens = {}
            for name, use_draft in order:
                pinned_k = k if use_draft else None
                run = harness.timed(lambda p=p, d=use_draft, n=pinned_k: modes.ovbuild([p], d, False, n))
                seconds[name], tokens[name] = seconds[name] + run.seconds, run.output
                if use_draft:
                    runs.append(modes.last_metrics.requests)  # the calls also fed the cost models
            if tokens["alone"] != tokens["pinned"]:
                raise SystemExit(f"pinned k = {k}: a request differs from ovbuild's target alone")
        tau = 1 + sum(r.num_accepted_tokens for r in runs) / max(sum(r.num_drafts for r in runs), 1)
        verify, draft = spec.target_cost.fastest(k + 1), spec.draft_cost.fastest(round(tau) + k + 1)
        host = spec.host_s + spec.draft_host_s  # a step with a draft call
        floor, pinned = tau * t1 / (verify + draft + host), seconds["alone"] / seconds["pinned"]
        best, best_pinned = max(best, (floor, k)), max(best_pinned, (pinned, k))
        print(
            f"    k={k}: tau {tau:.2f}, t_alone(1) {t1 * 1e3:.2f} ms, t_T({k + 1}) {verify * 1e3:.2f} ms, "
            f"t_D({round(tau) + k + 1}) {draft * 1e3:.2f} ms, host {host * 1e3:.2f} ms -> {floor:.2f}x; "
            f"measured {pinned:.2f}x"
        )
    print(
        f"  best floor {best[0]:.2f}x (k = {best[1]}); best pinned k measured {best_pinned[0]:.2f}x (k = "
        f"{best_pinned[1]}); ovbuild draft (adaptive) / alone measured {measured:.2f}x = {measured / best[0]:.0%} of "
        "the floor"
    )


def report(n: int, requests: int, new_tokens: int, rounds: harness.Rounds) -> None:
    """tokens/s per mode (median) and ratios taken within each round (median, min-max)."""
    label = "one request at a time" if n == 1 else f"{n} requests at once"
    tokens = requests * new_tokens
    print(f"\n{label} ({requests} prompts):")
    for name in rounds.seconds:
        print(f"  {name:<20} {tokens / rounds.median(name):8.1f} tokens/s")
    pairs = [("ovbuild alone (A/A)", "ovbuild alone"), ("ovbuild draft", "ovbuild alone")]
    pairs += [("ovbuild alone", "GenAI LLMPipeline"), ("ovbuild draft", "GenAI DFlash")] if n == 1 else []
    pairs += [("ovbuild alone", "GenAI CB"), ("ovbuild draft", "GenAI CB")] if n > 1 else []
    for a, b in pairs:
        print(f"  {a} / {b}: {rounds.ratio(b, a)}")  # speed a / speed b: seconds b / seconds a, within rounds


if __name__ == "__main__":
    main()

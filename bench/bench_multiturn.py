"""Multi-turn chat, where a client resends the whole conversation each turn: ovbuild with prefix caching against
OpenVINO GenAI's `ContinuousBatchingPipeline` with its prefix caching on and off, side by side in one process.

The workload: 4 conversations at once, each opening with a 1,500-token system prompt of its own, then 8 turns of 40
user tokens and 48 generated tokens (EOS ignored), the whole history sent every turn (2,204 tokens by the last turn).
Cases: ovbuild's target alone with prefix caching and without, ovbuild with the draft (adaptive draft length) with
prefix caching, GenAI CB with prefix caching on and off; both sides on the shipped demo pair exported both ways from
the same weights, f32 math and an f16 KV cache. Every round runs every case once in a new random order, on a workload
of its own (other token ids: each round's first turn is a miss on every side); every answer of every case must equal
ovbuild's target alone without caching, turn by turn, or the benchmark stops. Printed: the time of the 8 turns per case
(median over rounds) with ratios taken within rounds, and ovbuild's time to first token per turn with and without
prefix caching (the mean over the turn's 4 requests, median over rounds): turn 1 is a miss, later turns hit at least
the system prompt.

    python bench/bench_multiturn.py [--rounds 3] [--turns 8] [--system-tokens 1500] [--conversations 4]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import openvino as ov
import openvino_genai as genai

from ovbuild.demo import export_pair, shipped_pair
from ovbuild.export import export
from ovbuild.runtime.pipeline import FAST_DRAFT, ModelOptions, Pipeline, RuntimeOptions
from ovbuild.runtime.request import GenerationConfig

import harness

MATH, KV = "f32", "f16"
USER_TOKENS, ANSWER_TOKENS = 40, 48


class Workload:
    """One round's conversations: a system prompt and the user turns of each (token ids)."""

    def __init__(self, seed: int, conversations: int, system_tokens: int, turns: int, vocab: int):
        rng = np.random.default_rng(seed)
        low = 16  # ordinary token ids: the demo tokenizer's first ids are special or single bytes
        self.systems = [rng.integers(low, vocab, system_tokens).tolist() for _ in range(conversations)]
        self.users = [[rng.integers(low, vocab, USER_TOKENS).tolist() for _ in range(turns)] for _ in self.systems]

    def run(self, answer_turn) -> harness.Measured:
        """Every turn of every conversation through `answer_turn(prompts) -> (answers, ttfts)`; returns the seconds
        of all turns and (answers per turn, mean TTFT per turn or None)."""
        histories = [list(system) for system in self.systems]
        answers, ttfts, seconds = [], [], 0.0
        for turn in range(len(self.users[0])):
            prompts = [history + users[turn] for history, users in zip(histories, self.users, strict=True)]
            start = time.perf_counter()
            tokens, ttft = answer_turn(prompts)
            seconds += time.perf_counter() - start
            answers.append(tokens)
            ttfts.append(ttft)
            histories = [p + t for p, t in zip(prompts, tokens, strict=True)]
        return harness.Measured(seconds, (answers, ttfts))


class Cases:
    """Every case: a function answering one turn's prompts at once."""

    def __init__(self, paged: tuple[Path, Path, Path], genai_target: Path):
        """paged: the target exported for its draft (with taps), the draft, the target exported alone."""
        target = ModelOptions(KV, MATH, 512)

        def options(caching: bool) -> RuntimeOptions:
            return RuntimeOptions(target=target, draft=FAST_DRAFT, enable_prefix_caching=caching)

        self.alone = Pipeline(paged[2], None, options(True))
        self.alone_uncached = Pipeline(paged[2], None, options(False))
        self.draft = Pipeline(paged[0], paged[1], options(True))
        for pipeline in (self.alone, self.alone_uncached, self.draft):
            pipeline.compile_copies()
        props = {"INFERENCE_PRECISION_HINT": MATH, "KV_CACHE_PRECISION": KV}
        self.cb = {
            caching: genai.ContinuousBatchingPipeline(str(genai_target), scheduler_config(caching), "CPU", props)
            for caching in (True, False)
        }
        self.config = genai.GenerationConfig()
        self.config.max_new_tokens, self.config.ignore_eos = ANSWER_TOKENS, True

    def all(self) -> dict:
        return {
            "ovbuild alone, prefix caching": lambda p: self.ovbuild(self.alone, p),
            "ovbuild alone, no prefix caching": lambda p: self.ovbuild(self.alone_uncached, p),
            "ovbuild draft, prefix caching": lambda p: self.ovbuild(self.draft, p),
            "GenAI CB, prefix caching": lambda p: self.genai(self.cb[True], p),
            "GenAI CB, no prefix caching": lambda p: self.genai(self.cb[False], p),
        }

    @staticmethod
    def ovbuild(pipeline: Pipeline, prompts: list[list[int]]) -> tuple[list[list[int]], float]:
        scheduler = pipeline.scheduler()
        requests = [scheduler.add_request(p, GenerationConfig(ANSWER_TOKENS)) for p in prompts]
        scheduler.run()
        return [r.generated for r in requests], statistics.mean(r.metrics.ttft for r in requests)

    def genai(self, cb: genai.ContinuousBatchingPipeline, prompts: list[list[int]]) -> tuple[list[list[int]], None]:
        tensors = [ov.Tensor(np.array([p], np.int64)) for p in prompts]
        results = cb.generate(tensors, [self.config] * len(prompts))
        return [list(r.m_generation_ids[0]) for r in results], None


def scheduler_config(prefix_caching: bool) -> genai.SchedulerConfig:
    s = genai.SchedulerConfig()
    s.enable_prefix_caching = prefix_caching
    s.cache_size = 1  # GB
    return s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    harness.add_arguments(parser, rounds=3)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--system-tokens", type=int, default=1500)
    parser.add_argument("--conversations", type=int, default=4)
    args = parser.parse_args()
    harness.start(__doc__.splitlines()[0])
    with tempfile.TemporaryDirectory(prefix="ovbuild_multiturn_") as tmp:
        tmp = Path(tmp)
        target_ckpt, draft_ckpt = shipped_pair()
        paged = (
            *export_pair(target_ckpt, draft_ckpt, tmp / "paged"),
            export(target_ckpt, tmp / "paged" / "alone", quiet=True).out,  # untapped, as one serves it alone
        )
        genai_target = export(target_ckpt, tmp / "genai" / "target", format="genai", quiet=True).out
        cases = Cases(paged, genai_target)
        vocab = cases.alone.target.vocab_size
        print(
            f"demo pair, {args.conversations} conversations at once, {args.system_tokens}-token system prompts, "
            f"{args.turns} turns of {USER_TOKENS} user + {ANSWER_TOKENS} generated tokens, history resent; {MATH} "
            f"math, {KV} KV cache on both sides; {args.rounds} rounds interleaved (+1 warm-up)"
        )
        runs = cases.all()
        reference = "ovbuild alone, no prefix caching"
        rng = np.random.default_rng(args.seed)
        seconds: dict[str, list[float]] = {name: [] for name in runs}
        ttft: dict[str, list[list[float]]] = {name: [] for name in runs}
        for round_ in range(args.rounds + 1):  # round 0 warms up, untimed
            workload = Workload(1000 + round_, args.conversations, args.system_tokens, args.turns, vocab)
            outputs = {}
            for name in rng.permutation(list(runs)):
                measured = workload.run(runs[name])
                outputs[name] = measured.output
                if round_:
                    seconds[name].append(measured.seconds)
                    ttft[name].append(measured.output[1])
            for name, (answers, _) in outputs.items():
                if answers != outputs[reference][0]:
                    same = sum(a == b for a, b in zip(answers, outputs[reference][0], strict=True))
                    raise SystemExit(f"{name}: {same}/{args.turns} turns equal {reference!r}")
        print(f"\nall answers equal {reference!r} in every round\n")
        base = "GenAI CB, prefix caching"
        width = max(len(n) for n in runs)
        for name in runs:
            ratio = harness.ratio_of(seconds[base], seconds[name])
            print(f"  {name:<{width}}  {statistics.median(seconds[name]):8.2f} s   {base} / this {ratio}")
        print("\n  ovbuild time to first token per turn, ms (mean of the turn's requests, median over rounds):")
        names = [n for n in runs if n.startswith("ovbuild")]
        print("  turn " + "".join(f"{n:>36}" for n in names) + f"{'no caching / caching':>24}")
        for turn in range(args.turns):
            values = [statistics.median(r[turn] for r in ttft[n]) for n in names]
            gain = values[1] / values[0]
            print(f"  {turn + 1:>4} " + "".join(f"{v * 1e3:36.1f}" for v in values) + f"{gain:23.1f}x")
        hit = statistics.median(statistics.median(r[1:]) for r in ttft[names[0]]) if args.turns > 1 else float("nan")
        miss = statistics.median(statistics.median(r[1:]) for r in ttft[names[1]]) if args.turns > 1 else float("nan")
        print(
            f"\n  turns 2-{args.turns}: TTFT with a cached prefix {hit * 1e3:.1f} ms, the same turns recomputed "
            f"{miss * 1e3:.1f} ms: {miss / hit:.1f}x lower"
        )


if __name__ == "__main__":
    main()

"""End to end at Qwen3-4B scale: the real runtime serving a random target shaped like Qwen3-4B (int8 weights) with a
draft shaped like z-lab/Qwen3-4B-DFlash-b16, target alone against adaptive speculation, one request and 4 at once.

ACCEPTANCE IS SET, NOT EARNED. Random weights accept nothing, so the drafter is ovbuild.testing.steered.SteeredDrafter:
the real draft runs every call (its cache, context commits and head as in production), then its proposals are
replaced by the target alone's own tokens, each right with chance a once those before it are (which tokens are
wrong is drawn once per text, so every round meets the same ones), a set so that a full block of 16 gives a
published mean acceptance length tau (z-lab/Qwen3-4B-DFlash-b16, block 16, greedy, a third-party
SGLang harness: 3.4 MT-Bench, 5.6 MBPP, 6.7 HumanEval, 8.2 MATH-500). What is measured is what the runtime delivers
at that acceptance: call costs, planning, host work, rollback, and the draft lengths the planner chooses.

Printed per concurrency and tau: tokens/s of both sides while decoding (from the last first token to the last finish:
the prompts' prefill is the same work on both sides, and bench_cost_model's figures are per decode step), the speed-up
(target alone's seconds over speculation's, taken within each interleaved round: median and range) decoding and over
whole runs and while every request decodes (up to the first finish: with speculation requests finish at different
steps, and a closed batch's last steps serve fewer requests, a tail a server refilling its slots does not have), next
to an A/A control (the target alone run twice a round: what the machine does to a ratio by itself), the draft lengths
chosen, the acceptance measured, each draft length of --sweep pinned, the best of them and the planner over it (with
several requests also while every request decodes), and next to it the speed-up bench/bench_cost_model.py
implies from timed calls for the same tau ("after": the adaptive plan), per step and for runs of this many tokens (a
request's last steps propose only what it still lacks: finite_share), and for the acceptance the texts drew (a few
short texts stray from the a set: the runtime is judged against what it was given). Then the target alone against
GenAI's LLMPipeline on the same weights exported --format genai, one request, both computing in --inference-precision
(f32 by default) with an f16 KV cache, and where their tokens first differ: random weights give near-flat logits, where
the two runtimes' attention kernels round other ways, so whether each side repeats itself round after round is printed
too.

The first run writes the random checkpoints (about 9 GB bf16) and exports them (about 4.5 GB int8 each way) into
--workdir, which later runs reuse. A full run after that, on 2 cores: about 10 minutes at the defaults (9.2 on a
2-core AVX-512 EPYC; prompts and tokens are cut to fit, never the model's shape).

    python bench/bench_real_scale.py [--workdir DIR] [--rounds 3] [--new-tokens 64] [--texts 1] [--requests 1,4]
        [--taus 3.4,5.6,6.7,8.2] [--no-genai] [--no-cost-model]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from itertools import zip_longest
from pathlib import Path

import bench_cost_model  # the benchmark helpers beside this file (its folder is on sys.path when run)
import numpy as np

from ovbuild.export import export
from ovbuild.runtime.model.paged_model import PagedModel, compile_config
from ovbuild.runtime.pipeline import EXACT_TARGET, FAST_DRAFT, ModelOptions, Pipeline, RuntimeOptions
from ovbuild.runtime.request import GenerationConfig, Status
from ovbuild.runtime.scheduler import Scheduler
from ovbuild.runtime.speculation.call_cost import BUCKETS, bucket
from ovbuild.runtime.speculation.planner import Speculation
from ovbuild.testing.steered import SteeredDrafter
from ovbuild.testing.tokenizer import write_tokenizer

import harness
from shapes import QWEN3_4B, QWEN3_4B_DFLASH_B16, write_draft, write_target

PUBLISHED_TAUS = (3.4, 5.6, 6.7, 8.2)  # z-lab/Qwen3-4B-DFlash-b16: MT-Bench, MBPP, HumanEval, MATH-500


# --smoke: the same script on a narrow, shallow pair of the same vocabulary and heads (checks the script; its figures
# say nothing about Qwen3-4B)
SMOKE_TARGET = {**QWEN3_4B, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 8}
SMOKE_TARGET["layer_types"] = ["full_attention"] * 8
SMOKE_DRAFT = {**QWEN3_4B_DFLASH_B16, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
               "layer_types": ["full_attention"] * 2, "num_target_layers": 8,
               "dflash_config": {**QWEN3_4B_DFLASH_B16["dflash_config"], "target_layer_ids": [1, 3, 5]}}  # fmt: skip


def prepare(root: Path, weight_format: str, genai: bool, smoke: bool = False) -> dict[str, Path]:
    """Random checkpoints and their exports under `root`, made once (each step skipped when its folder exists)."""
    ckpt_target, ckpt_draft = root / "ckpt" / "target", root / "ckpt" / "draft"
    if not (ckpt_target / "config.json").exists():
        start_s = time.perf_counter()
        write_target(ckpt_target, SMOKE_TARGET if smoke else QWEN3_4B)
        write_tokenizer(ckpt_target)  # byte-level ids: prompts are token ids here, the text never matters
        (ckpt_target / "generation_config.json").write_text(json.dumps({"eos_token_id": QWEN3_4B["eos_token_id"]}))
        if smoke:
            write_draft(ckpt_draft, SMOKE_DRAFT, SMOKE_TARGET["hidden_size"])
        else:
            write_draft(ckpt_draft)
        print(f"random checkpoints written in {time.perf_counter() - start_s:.0f} s", flush=True)
    out = {"target": root / weight_format / "target", "draft": root / weight_format / "draft"}
    jobs = [
        (
            "target",
            lambda: export(ckpt_target, out["target"], draft_of=ckpt_draft, weight_format=weight_format, quiet=True),
        ),
        (
            "draft",
            lambda: export(ckpt_draft, out["draft"], target_model=ckpt_target, weight_format=weight_format, quiet=True),
        ),
    ]
    if genai:
        out["genai"] = root / f"genai-{weight_format}" / "target"
        jobs.append(
            (
                "genai",
                lambda: export(ckpt_target, out["genai"], weight_format=weight_format, format="genai", quiet=True),
            )
        )
    for name, job in jobs:
        if not (out[name] / "config.json").exists():
            start_s = time.perf_counter()
            job()
            print(f"exported {name} ({weight_format}) in {time.perf_counter() - start_s:.0f} s", flush=True)
    return out


class Serving:
    """The pipeline's compiled target and draft; one steered drafter and planner per tau (a planner learns a run's
    acceptance, so each tau keeps its own; the call-cost models are shared: the calls are the same)."""

    def __init__(self, pipeline: Pipeline, taus: list[float], new_tokens: int):
        self.pipeline, self.new_tokens = pipeline, new_tokens
        inner = pipeline.drafter
        self.chance = {tau: bench_cost_model.constant_acceptance(tau) for tau in taus}
        self.drafters = {
            tau: SteeredDrafter(inner, pipeline.target.vocab_size, seed=i, accept_chance=a)
            for i, (tau, a) in enumerate(self.chance.items())
        }
        base = pipeline.speculation
        self.plans = {}
        for tau in taus:
            spec = Speculation(inner.max_candidates, inner.candidate_offset)
            spec.target_cost, spec.draft_cost = base.target_cost, base.draft_cost
            spec.calibration_cache, spec.calibration_tried = base.calibration_cache, base.calibration_tried
            self.plans[tau] = spec
        # pinned draft lengths read no costs and must not teach the planners: their own planner (acceptance only)
        self.pinned_plans = {tau: Speculation(inner.max_candidates, inner.candidate_offset) for tau in taus}
        self.truths: dict[tuple[int, ...], list[int]] = {}
        self.draft_lengths = {tau: [] for tau in taus}  # decode steps that drafted 0, 1, ... tokens (summed)
        self.acceptance = {tau: [] for tau in taus}  # mean acceptance length per run
        self.wall = 0.0  # seconds of the last run, prefill included (timed_run)
        # tokens and seconds of the last run while every request decoded (full_batch_span)
        self.full_tokens, self.full_seconds = 0, 0.0
        self.target_log, self.draft_log = CallLog(pipeline.target), CallLog(inner.model)

    def alone(self, prompts: list[list[int]]) -> harness.Measured:
        scheduler = Scheduler(self.pipeline.target, max_model_len=self.pipeline.max_model_len)
        requests = [scheduler.add_request(p, GenerationConfig(self.new_tokens)) for p in prompts]
        out = self.timed_run(scheduler, requests)
        for p, tokens in zip(prompts, out.output, strict=True):
            self.truths[tuple(p)] = [*p, *tokens]
        return out

    def timed_run(self, scheduler: Scheduler, requests: list) -> harness.Measured:
        """Run the requests; their tokens, timed from the last first token to the last finish (the decode phase,
        which bench_cost_model's per-step figures speak of: the prompts' prefill is the same work on both sides).
        The whole run's seconds are kept in self.wall, its tokens and seconds while every request decoded in
        self.full_tokens and self.full_seconds."""
        start = time.perf_counter()
        steps = []  # after each step: (its end, tokens generated so far, requests finished so far)
        while scheduler.has_unfinished():
            scheduler.step()
            done = sum(r.status is Status.FINISHED for r in requests)
            steps.append((time.perf_counter(), sum(len(r.generated) for r in requests), done))
        self.wall = time.perf_counter() - start
        first = max(r.metrics.first_token_time for r in requests)
        self.full_tokens, self.full_seconds = full_batch_span(steps, first)
        last = max(r.metrics.finish_time for r in requests)
        return harness.Measured(last - first, [r.generated for r in requests])

    def speculative(self, prompts: list[list[int]], tau: float, k: int | None = None) -> harness.Measured:
        """The requests with the steered draft at `tau`: the planner's draft lengths, or k pinned."""
        drafter, spec = self.drafters[tau], self.plans[tau] if k is None else self.pinned_plans[tau]
        scheduler = Scheduler(
            self.pipeline.target, drafter, max_model_len=self.pipeline.max_model_len, speculation=spec
        )
        config = GenerationConfig(self.new_tokens, num_assistant_tokens=k)
        requests = [scheduler.add_request(p, config) for p in prompts]
        for r, p in zip(requests, prompts, strict=True):
            drafter.truths[r.id] = self.truths[tuple(p)]
        out = self.timed_run(scheduler, requests)
        m = scheduler.metrics.requests
        if k is not None:
            for r in requests:
                drafter.truths.pop(r.id, None)
            return out
        self.draft_lengths[tau] = [x + y for x, y in zip_longest(self.draft_lengths[tau], m.draft_length_histogram,
                                                                 fillvalue=0)]  # fmt: skip
        self.acceptance[tau].append(m.mean_acceptance_length)
        for r in requests:
            drafter.truths.pop(r.id, None)
        return out

    @property
    def full(self) -> float:
        """Tokens/s of the last run while every request decoded (nan if it never did)."""
        return self.full_tokens / self.full_seconds if self.full_seconds > 0 else float("nan")

    def in_turn(self, run, texts: list[list[list[int]]]) -> harness.Measured:
        """run(prompts) for each set of prompts in `texts`, one set after the other (each request slot serves one text
        after another): seconds, wall and the span while every request decodes summed over them, outputs in order."""
        seconds, outputs, wall, tokens, span = 0.0, [], 0.0, 0, 0.0
        for prompts in texts:
            measured = run(prompts)
            seconds, outputs = seconds + measured.seconds, outputs + measured.output
            wall, tokens, span = wall + self.wall, tokens + self.full_tokens, span + self.full_seconds
        self.wall, self.full_tokens, self.full_seconds = wall, tokens, span
        return harness.Measured(seconds, outputs)


def full_batch_span(steps: list[tuple[float, int, int]], decoding_from: float) -> tuple[int, float]:
    """(tokens, seconds) from the step that gave the last request its first token to the first step a request
    finished in: while every request decodes. With speculation requests finish at different steps, and the run's last
    steps serve fewer requests than it began with (a closed batch's tail, which a server refilling its slots does not
    have). (0, 0.0) where no step lies between."""
    begin = next(i for i, (end, _, _) in enumerate(steps) if end >= decoding_from)
    end = next(i for i, (_, _, done) in enumerate(steps) if done)
    if end <= begin:
        return 0, 0.0
    return steps[end][1] - steps[begin][1], steps[end][0] - steps[begin][0]


class CallLog:
    """Every call of a model, timed: (requests in it, rows, seconds), so that the cost of a call by rows and by
    requests is printed from the calls the runs made (the planner prices calls by rows alone)."""

    def __init__(self, model: PagedModel):
        self.calls: list[tuple[int, int, float]] = []
        run = model.run

        def timed_run(rows, inputs, *args, **kwargs):
            start = time.perf_counter()
            out = run(rows, inputs, *args, **kwargs)
            seconds = time.perf_counter() - start
            self.calls.append((len({r.seq_id for r in rows}), sum(r.num_rows for r in rows), seconds))
            return out

        model.run = timed_run

    def table(self, since: int) -> str:
        """Median ms of the calls since `since` by requests and rows (the planner's row buckets: call_cost.BUCKETS;
        cells of at least 3 calls)."""
        by: dict[tuple[int, int], list[float]] = {}
        for requests, rows, seconds in self.calls[since:]:
            by.setdefault((requests, int(BUCKETS[bucket(rows)])), []).append(seconds)
        cells = [
            f"{n} x ~{r} rows {statistics.median(t) * 1e3:.0f} ms ({len(t)})"
            for (n, r), t in sorted(by.items(), key=lambda item: (item[0][1], item[0][0]))
            if len(t) >= 3
        ]
        return "; ".join(cells) or "none"


def lengths_line(histogram: list[int]) -> str:
    steps = sum(histogram)
    return ", ".join(f"k={k} {n / steps:.0%}" for k, n in enumerate(histogram) if n) if steps else "none"


def implied(pipeline: Pipeline, n: int, taus: list[float], context: int, repeats: int) -> dict[float, dict]:
    """bench_cost_model's figures for the same calls at these taus: its `after` (the adaptive plan) per tau."""
    bench_cost_model.TAUS = tuple(taus)
    args = argparse.Namespace(context=context, tau_context=4, rounds=repeats, seed=0, shape="qwen3-4b")
    rows = bench_cost_model.measure(pipeline.target, pipeline.drafter, n, args, np.random.default_rng(0))
    for s in range(n):  # the timed calls ran under sequence ids 0..n-1
        pipeline.target.free(s)
        pipeline.drafter.model.free(s)
    return {row["tau"]: row for row in rows}


def finite_share(a: float, ks: list[int], tokens: int, tau_k: float, trials: int = 4000) -> float:
    """What share of bench_cost_model's per-step speed-up a run of `tokens` decoded tokens per request can reach.
    The per-step figure assumes every step proposes k; a request's last steps may propose only what it still lacks,
    so it takes more steps than tokens / tau(k) (simulated: each proposal accepted with chance `a` while those before
    it were; requests count alike, as a step's cost grows with the requests in it)."""
    rng = np.random.default_rng(0)
    steps = 0
    for _ in range(trials):
        for k in ks:
            left = tokens
            while left > 0:
                proposals = min(k, left - 1)
                accepted = next((j for j in range(proposals) if rng.random() >= a), proposals)
                left, steps = left - accepted - 1, steps + 1
    return tokens / (tau_k * steps / (trials * len(ks)))


def run_concurrency(serving: Serving, n: int, args, rng) -> None:
    # n requests at once, each serving args.texts texts one after the other
    texts = [[rng.integers(1000, 100000, args.prompt_tokens).tolist() for _ in range(n)] for _ in range(args.texts)]
    prompts = [p for batch in texts for p in batch]
    serving.in_turn(serving.alone, texts)  # the truths the steered drafter proposes from
    # the target alone twice a round: how far this machine moves a ratio of the same work by itself (the A/A control)
    cases = {"alone": lambda: serving.in_turn(serving.alone, texts)}
    cases["alone A/A"] = cases["alone"]
    cases |= {
        f"tau {tau}": (lambda tau=tau: serving.in_turn(lambda p: serving.speculative(p, tau), texts))
        for tau in args.taus
    }
    # untimed warm-up of the cases that learn (the planners); pinned draft lengths have nothing to learn, and their
    # calls are the same calls: they are timed from the first round
    for case in cases.values():
        case()
    cases |= {
        fixed(tau, k): (lambda tau=tau, k=k: serving.in_turn(lambda p: serving.speculative(p, tau, k), texts))
        for tau in args.taus
        for k in args.sweep
    }
    walls: dict[str, list[float]] = {name: [] for name in cases}  # whole runs, prefill included
    fulls: dict[str, list[float]] = {name: [] for name in cases}  # tokens/s while every request decodes

    def kept(name: str) -> None:
        walls[name].append(serving.wall)
        fulls[name].append(serving.full)

    since = len(serving.target_log.calls), len(serving.draft_log.calls)
    rounds = harness.interleave(cases, args.rounds, seed=args.seed, warmup=False, check=lambda name, _: kept(name))
    harness.require_equal(rounds.outputs, "alone")
    target_calls, draft_calls = serving.target_log.table(since[0]), serving.draft_log.table(since[1])
    decoded = len(prompts) * (args.new_tokens - 1)  # the first token of each request comes from its prefill
    # one call per case and round there: more rounds than the runs take, or the yardstick is noisier than the runs
    repeats = max(3 * args.rounds, 9)
    truths = [serving.truths[tuple(p)] for p in prompts]
    drawn = {tau: drawn_tau(serving.drafters[tau], truths, args) for tau in args.taus}
    asked = sorted({*args.taus, *drawn.values()})
    figures = implied(serving.pipeline, n, asked, args.prompt_tokens, repeats) if args.cost_model else {}
    texts_each = f"{args.texts} text{'s' if args.texts > 1 else ''} each in turn"
    print(f"\n{n} request{'s' if n > 1 else ''} at once, {texts_each}, {args.prompt_tokens}-token prompts, "
          f"{args.new_tokens} new tokens each, {args.rounds} rounds; decode phase (after the first token; the prefill "
          "is the same work on both sides), and whole runs:")  # fmt: skip
    print(f"  target alone: {decoded / rounds.median('alone'):.2f} tokens/s decoding (median round), "
          f"{statistics.median(walls['alone']):.2f} s a run; A/A control (the target alone again) "
          f"{rounds.ratio('alone', 'alone A/A')}")  # fmt: skip
    print(f"  timed calls (requests x rows, median, calls): target {target_calls}; draft {draft_calls}")
    costs = serving.plans[args.taus[0]]  # the planners share their cost curves
    priced = (1, 2, 4, 6, 8, 12, 16, 24, 32)
    print(
        "  the planner's priced calls now (rows: ms): target "
        + ", ".join(f"{r}: {costs.target_cost(r) * 1e3:.0f}" for r in priced)
        + "; draft "
        + ", ".join(f"{r}: {costs.draft_cost(r) * 1e3:.0f}" for r in priced)
        + f"; drift {costs.target_cost.drift:.2f} and {costs.draft_cost.drift:.2f}; host by requests: "
        + ", ".join(f"{n}: {costs.host_costs(n)[0] * 1e3:.2f} + {costs.host_costs(n)[1] * 1e3:.2f} ms" for n in (1, 4))
    )
    for tau in args.taus:
        name = f"tau {tau}"
        ratio = rounds.ratio("alone", name)
        line = (
            f"  tau {tau:>4} (a = {serving.chance[tau]:.3f} per position): {decoded / rounds.median(name):.2f} "
            f"tokens/s decoding, speed-up {ratio} (whole runs {harness.ratio_of(walls['alone'], walls[name])}; "
            f"while every request decodes {harness.ratio_of(fulls[name], fulls['alone'])}); "
            f"measured acceptance length {statistics.median(serving.acceptance[tau]):.2f}; draft lengths chosen "
            f"{lengths_line(serving.draft_lengths[tau])}"
        )
        if args.sweep:
            line += "\n    " + sweep_line(rounds, tau, args.sweep)
            if n > 1:
                line += "\n    " + full_batch_sweep_line(fulls, tau, args.sweep)
        if tau in figures:
            line += f"; implied by bench_cost_model {against(figures[tau], ratio.median, args.new_tokens - 1)}"
            row = figures[drawn[tau]]
            line += (
                f"; at the acceptance its texts drew (a = {row['a']:.3f}, tau {drawn[tau]:.2f}): implied "
                f"{against(row, ratio.median, args.new_tokens - 1)}"
            )
        print(line, flush=True)


def fixed(tau: float, k: int) -> str:
    """The case name of tau's steered draft with k pinned."""
    return f"tau {tau} k={k}"


def sweep_line(rounds: harness.Rounds, tau: float, ks: list[int]) -> str:
    """Each pinned k's speed-up over the target alone, the best of them (by median), and the planner's speed over
    that best k's, taken within each round (median and range)."""
    speedups = {k: rounds.ratio("alone", fixed(tau, k)) for k in ks}
    best = max(ks, key=lambda k: speedups[k].median)
    each = ", ".join(f"k={k} {speedups[k].median:.2f}x" for k in ks)
    return (
        f"pinned: {each}; best pinned k={best} {speedups[best]}; planner / best pinned "
        f"{rounds.ratio(fixed(tau, best), f'tau {tau}')}"
    )


def full_batch_sweep_line(fulls: dict[str, list[float]], tau: float, ks: list[int]) -> str:
    """sweep_line while every request decodes (full_batch_rate): a planner drafting each request its own length ends
    the requests at different steps, and a closed batch's tail (the last requests alone, in steps that cost about as
    much as the full batch's) weighs on its whole-run figure where a server refilling its slots has no tail."""
    speedups = {k: harness.ratio_of(fulls[fixed(tau, k)], fulls["alone"]) for k in ks}
    best = max(ks, key=lambda k: speedups[k].median)
    each = ", ".join(f"k={k} {speedups[k].median:.2f}x" for k in ks)
    planner = harness.ratio_of(fulls[f"tau {tau}"], fulls[fixed(tau, best)])
    return f"while every request decodes: pinned {each}; best pinned k={best}; planner / best pinned {planner}"


def against(row: dict, delivered: float, tokens: int) -> str:
    """bench_cost_model's speed-up for one tau, per step and for runs of `tokens` decoded tokens, with the delivered
    speed-up's share of each."""
    implied_x = row["after"]
    finite_x = implied_x * finite_share(row["a"], row["ks"], tokens, row["tau_k"])
    return (
        f"{implied_x:.2f}x per step, {finite_x:.2f}x for {tokens} tokens (decoding delivered / implied "
        f"{delivered / implied_x:.2f} per step, {delivered / finite_x:.2f} for the tokens)"
    )


def drawn_tau(drafter: SteeredDrafter, truths: list[list[int]], args) -> float:
    """The tau of the acceptance the steered drafter drew for these texts: the share of right tokens a over the
    positions proposals can cover (after each request's first token, which its prefill makes), as a full block's
    1 + a + ... + a^15. The texts are short, so a drawn share strays from the one set (about 0.05 over 63 positions
    at tau 5.6): measured against the cost model at the set tau, a run's luck reads as the runtime's."""
    start = args.prompt_tokens + 1
    right = np.concatenate([drafter.right_positions(t)[start : start + args.new_tokens - 1] for t in truths])
    a = float(right.mean())
    return 1 + sum(a**j for j in range(1, bench_cost_model.FULL + 1))


def forget_checkpoints(root: Path) -> None:
    """Drop the random checkpoints' pages from the page cache (posix_fadvise, these files only): written or read
    once by the export, 9 GB of them stayed cached and pushed the mapped IR weights out while timing."""
    for path in (root / "ckpt").rglob("*"):
        if path.is_file():
            with open(path, "rb") as f:
                os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def genai_process(args) -> None:
    """The comparison with GenAI in a process of its own, before this one compiles anything: only the two targets it
    compares in memory. Run last in this process, beside the draft pipeline and with GenAI's copy a third 4.5 GB
    model on a 24 GB machine, it read ovbuild alone at 0.69x GenAI where a run on its own read 1.15x."""
    keep = ["--workdir", args.workdir, "--weight-format", args.weight_format, "--seed", str(args.seed)]
    keep += ["--inference-precision", args.inference_precision, "--rounds", str(args.rounds)]
    keep += ["--new-tokens", str(args.new_tokens), "--prompt-tokens", str(args.prompt_tokens)]
    subprocess.run([sys.executable, __file__, "--genai-only", *keep, *(["--smoke"] if args.smoke else [])], check=True)


def against_genai(folders: dict[str, Path], args) -> None:
    """The target alone (ovbuild) and GenAI's LLMPipeline on the same weights, one request, interleaved rounds after
    a warm-up of each; major page faults while each side ran (weights read back from disk) are counted."""
    import openvino as ov
    import openvino_genai as genai

    options = RuntimeOptions(target=ModelOptions("f16", args.inference_precision, 2048))
    pipeline = Pipeline(folders["target"], None, options)
    props = {"INFERENCE_PRECISION_HINT": args.inference_precision, "KV_CACHE_PRECISION": "f16"}
    props |= {k: v for k, v in compile_config("f16").items() if k == "DYNAMIC_QUANTIZATION_GROUP_SIZE"}  # as ovbuild's
    llm = genai.LLMPipeline(str(folders["genai"]), "CPU", **props)
    config = genai.GenerationConfig()
    config.max_new_tokens, config.ignore_eos = args.new_tokens, True
    prompt = np.random.default_rng(args.seed).integers(1000, 100000, args.prompt_tokens).tolist()

    def ovbuild_alone() -> list[int]:
        # no prefix caching: LLMPipeline runs the whole prompt every call, and so must ovbuild for the same work
        scheduler = Scheduler(pipeline.target, max_model_len=pipeline.max_model_len, enable_prefix_caching=False)
        request = scheduler.add_request(prompt, GenerationConfig(args.new_tokens))
        scheduler.run()
        return request.generated

    def genai_llm() -> list[int]:
        ids = np.array([prompt], np.int64)  # [1, prompt tokens]; a mask of its own each call (GenAI reads it)
        return list(llm.generate(genai.TokenizedInputs(ov.Tensor(ids), ov.Tensor(np.ones_like(ids))), config).tokens[0])

    faults: dict[str, int] = {"ovbuild alone": 0, "GenAI LLMPipeline": 0}

    def counted(name: str, run: Callable[[], list[int]]) -> Callable[[], list[int]]:
        def call() -> list[int]:
            before = resource.getrusage(resource.RUSAGE_SELF).ru_majflt
            out = run()
            faults[name] += resource.getrusage(resource.RUSAGE_SELF).ru_majflt - before
            return out

        return call

    seen: dict[str, list[list[int]]] = {name: [] for name in faults}
    cases = {"ovbuild alone": counted("ovbuild alone", ovbuild_alone)}
    cases["GenAI LLMPipeline"] = counted("GenAI LLMPipeline", genai_llm)
    for case in cases.values():  # a second warm-up (interleave makes one): first calls page the weights in
        case()
    warm = dict(faults)
    rounds = harness.interleave(cases, args.rounds, args.seed, check=lambda name, tokens: seen[name].append(tokens))
    ratio = rounds.ratio("GenAI LLMPipeline", "ovbuild alone")
    print(
        f"\ntarget alone against GenAI LLMPipeline, one request, {args.new_tokens} new tokens, {args.rounds} rounds "
        f"(a process of its own, both targets warmed up; {available_gb():.1f} GB of memory available):"
    )
    for name in rounds.seconds:
        timed_faults = faults[name] - warm[name]
        print(
            f"  {name}: {args.new_tokens / rounds.median(name):.2f} tokens/s (median round); {timed_faults} major page "
            "faults while timed"
        )
    print(f"  ovbuild / GenAI speed {ratio}", flush=True)
    # Random weights make near-flat logits (top-2 gaps of a few hundredths), where the two runtimes' other attention
    # kernels can pick other tokens; whether each side at least repeats itself tells rounding from a defect.
    ours, theirs = seen["ovbuild alone"], seen["GenAI LLMPipeline"]
    print(
        f"  tokens: the same {first_difference(ours[0], theirs[0])} in the first round; every round alike: ovbuild "
        f"{alike(ours)}, GenAI {alike(theirs)}",
        flush=True,
    )


def available_gb() -> float:
    """MemAvailable of /proc/meminfo, in GB (nan where there is none)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return float("nan")


def alike(outputs: list[list[int]]) -> str:
    """'yes' when every round gave the first round's tokens."""
    return "yes" if all(t == outputs[0] for t in outputs) else "NO"


def first_difference(a: list[int], b: list[int]) -> str:
    """'throughout', or 'up to token i' where the two token lists first differ."""
    i = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return "throughout" if i == len(a) == len(b) else f"up to token {i}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    harness.add_arguments(parser, rounds=3)
    parser.add_argument("--workdir", default="/tmp/ovbuild_real_scale", help="checkpoints and exports, kept")
    parser.add_argument("--weight-format", default="int8")
    parser.add_argument("--inference-precision", default="f32", help="target math on both sides (f32 = exact)")
    parser.add_argument("--requests", default="1,4")
    parser.add_argument("--taus", default=",".join(map(str, PUBLISHED_TAUS)))
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument(
        "--texts",
        type=int,
        default=1,
        help="texts each request serves in turn: one text's wrong tokens fall where they fall, and which pinned k "
        "fits them best is luck that several texts even out",
    )
    parser.add_argument(
        "--sweep", default="0,2,4,7,11,15", help="draft lengths pinned beside the planner at every tau ('' for none)"
    )
    parser.add_argument("--no-genai", dest="genai", action="store_false")
    parser.add_argument("--genai-only", action="store_true", help=argparse.SUPPRESS)  # the comparison's own process
    parser.add_argument("--no-cost-model", dest="cost_model", action="store_false")
    parser.add_argument("--prepare", action="store_true", help="only write and export the models into --workdir")
    parser.add_argument("--smoke", action="store_true", help="a small pair of the same vocabulary (checks the script)")
    args = parser.parse_args()
    args.taus = [float(t) for t in args.taus.split(",")]
    args.sweep = [int(k) for k in args.sweep.split(",") if k]
    if args.genai_only:
        folders = prepare(Path(args.workdir), args.weight_format, True, args.smoke)
        against_genai(folders, args)
        return
    harness.start("bench_real_scale: Qwen3-4B-shaped target + z-lab/Qwen3-4B-DFlash-b16-shaped draft, random weights; "
          "ACCEPTANCE IS SET (SteeredDrafter), NOT EARNED")  # fmt: skip
    print(
        f"target {QWEN3_4B['num_hidden_layers']} layers x {QWEN3_4B['hidden_size']}, draft "
        f"{QWEN3_4B_DFLASH_B16['num_hidden_layers']} layers, block {bench_cost_model.BLOCK}; {args.weight_format} "
        f"weights; target {args.inference_precision} math + f16 KV cache, draft default math + u8 cache",
        flush=True,
    )
    folders = prepare(Path(args.workdir), args.weight_format, args.genai, args.smoke)
    if args.prepare:
        return
    forget_checkpoints(Path(args.workdir))
    if args.genai:
        genai_process(args)
    start_s = time.perf_counter()
    options = RuntimeOptions(
        target=ModelOptions("f16", args.inference_precision, 2048), draft=ModelOptions(*vars_of(FAST_DRAFT, 1024))
    )
    pipeline = Pipeline(folders["target"], folders["draft"], options)
    # every static copy compiled before timing, as the server does: a copy's first calls otherwise come in the timed
    # rounds, and a call cost's first call of a row count is what its bucket starts from
    pipeline.compile_copies()
    print(f"compiled in {time.perf_counter() - start_s:.0f} s: {pipeline.describe()}", flush=True)
    assert isinstance(pipeline.target, PagedModel) and EXACT_TARGET.kv_cache_precision == "f16"
    warm = pipeline.generate([list(range(1000, 1000 + args.prompt_tokens))], 4)  # calibrates the planner's costs
    print(f"warm-up done (calibration {warm[1].calibration_s * 1e3:.0f} ms)", flush=True)
    serving = Serving(pipeline, args.taus, args.new_tokens)
    rng = np.random.default_rng(args.seed)
    for n in (int(x) for x in args.requests.split(",") if x):  # --requests "": only the comparison with GenAI
        run_concurrency(serving, n, args, rng)


def vars_of(options: ModelOptions, cache_mb: float) -> tuple:
    """A model's options with another cache size."""
    return options.kv_cache_precision, options.inference_precision, cache_mb, options.static_rows


if __name__ == "__main__":
    main()

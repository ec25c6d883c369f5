"""Cost model at real scale: what a speculative step costs against a plain decode step, and the speed-up implied,
with the old fixed full block and with the adaptive draft length (ovbuild.runtime.speculation.planner).

A random target shaped like Qwen3-4B and a draft shaped like z-lab/Qwen3-4B-DFlash-b16 (int8 weights by default) are
written locally and built. With n sequences of `--context` tokens each, the script first times the target on r rows
per sequence and the draft on `--tau-context` context rows plus a block per sequence, over the row counts the planner
keeps costs at (the cost tables), and the host time per scheduler step (Python packing and verification, measured on
the tiny pair at the same concurrency). At published acceptance lengths tau (tokens per step at the full block of 16):

  before: the draft always runs its full block and the target verifies 15 tokens,
          x = tau * (t_target(1) + host_alone) / (t_target(16) + t_draft(ctx + 16) + host_spec)
  after:  each request drafts k = 0..15 tokens (k + 1 target rows, k + 1 block rows, no draft call at k = 0), k
          chosen by `Speculation.plan` from the cost tables and a per-position acceptance a constant over positions
          with a + a^2 + ... + a^15 = tau - 1 (so tau(k) = 1 + a + ... + a^k),
          x = tau(k) * (t_target(1) + host_alone) / (t_target(k + 1) + t_draft(ctx + k + 1) + host_spec + t_plan)
  floor:  tau * t_target(1) / (t_target(16) + t_draft(ctx + 16) + host_spec), every call at its fastest over the
          rounds (the floor of a full block at that tau; the plain decode's host time left out)

The calls in these formulas are timed in rounds (bench/harness.py), each round running the plain decode step, the
full-block step and every tau's planned step in a new order, so that a busy moment of a shared machine hits all of
them; `before`, `after` and `after / before` are medians of per-round ratios.

`--shape qwen3.5-moe-scaled` runs it with a mixture-of-experts target (bench/shapes.py: QWEN35_MOE_SCALED,
Qwen3.5-35B-A3B's 256 experts, 8 per token, at half its hidden and expert widths, 4 layers) and a DFlash draft for it,
at the upstream DSpark figure of 9.9 tokens per step (MiniCPM-V-4.7-35B-A3B-DSpark), host time on the tiny MoE pair.

`--shape qwen3.6-scaled` runs the same with a hybrid target (bench/shapes.py: QWEN36_SCALED, Qwen3.6-27B's layer
pattern and head widths scaled to this machine) and a DFlash draft for it, the host time taken on the tiny hybrid
pair; the verification calls then report the linear-attention states after every row, as the scheduler's do.

`--moe-designs` instead times the MoE MLP's routing designs side by side (ovbuild/graph/moe.py, docs/moe.md): one
Qwen3.5-35B-A3B-style layer (bench/shapes.py: MOE_SPEC, 256 experts, 8 per token, hidden 1024, experts and shared
expert of 256; `--moe-shrink N` divides the expert count and widths by N for a quick check), f32 math, the IR's own
weight format (int8 per channel, or int4 in groups of 128), on packed decode (1 and 4 sequences x 1 row),
verification (1 x 16, 4 x 5 rows) and a 128-row prefill chunk: median ms over interleaved rounds (every design and
row count once per round), dense / gather taken within rounds. The gather design's 128-row call holds
several GB at full widths (peak RSS 6.3 GB with 32 experts of 256); `--moe-shrink 4` peaks at 1.7 GB.

    python bench/bench_cost_model.py [--shape qwen3-4b|qwen3.6-scaled|qwen3.5-moe-scaled] [--weight-format int8]
                                     [--requests 1,4] [--workdir DIR]
    python bench/bench_cost_model.py --moe-designs [--weight-format int8|int4] [--moe-shrink 1] [--rounds 5]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import openvino as ov
from openvino import opset16

from ovbuild.families import load_draft
from ovbuild.graph.context import BuildContext
from ovbuild.graph.dflash import build_dflash_draft
from ovbuild.graph.moe import MOE_DESIGNS, moe_mlp
from ovbuild.graph.ops import result
from ovbuild.graph.weights import WeightPolicy
from ovbuild.runtime.cache.kv_cache import SequenceRows, sequence_rows
from ovbuild.runtime.model.paged_model import PagedModel
from ovbuild.runtime.request import GenerationConfig
from ovbuild.runtime.scheduler import Scheduler
from ovbuild.runtime.speculation.acceptance import AcceptanceStats
from ovbuild.runtime.speculation.call_cost import BUCKETS
from ovbuild.runtime.speculation.drafters import BlockDrafter
from ovbuild.runtime.speculation.planner import Speculation
from ovbuild.targets import build_paged_target, load_target
from ovbuild.testing import write_tiny_dflash, write_tiny_target
from ovbuild.testing.tiny_hybrid import write_tiny_hybrid_dflash, write_tiny_hybrid_target
from ovbuild.testing.tiny_moe import write_tiny_moe_target
from ovbuild.weights.checkpoint import Checkpoint
from ovbuild.weights.moe import MoeSpec
from ovbuild.weights.tensor_names import WeightSource

import harness
from shapes import (
    MOE_HIDDEN,
    MOE_SPEC,
    QWEN3_4B_DFLASH_B16,
    QWEN35_MOE_SCALED_DFLASH,
    QWEN36_SCALED_DFLASH,
    write_draft,
    write_hybrid_target,
    write_moe_layer,
    write_moe_target,
    write_target,
)

TAUS = (5.4, 3.1)  # DFlash on Qwen3-4B, GSM8K and MT-Bench (DSpark paper, table 1)
BLOCK = QWEN3_4B_DFLASH_B16["dflash_config"]["block_size"]
FULL = BLOCK - 1  # proposals of a full block (candidate offset 1)
TABLE_REPEATS = 3  # calls per row count in the cost tables (they only steer the plan)
# --shape: (write the real-scale target, write its draft, write the tiny target and draft the host time is taken on)
SHAPES = {
    "qwen3-4b": (write_target, write_draft, write_tiny_target, write_tiny_dflash),
    "qwen3.6-scaled": (
        write_hybrid_target,
        lambda folder: write_draft(folder, QWEN36_SCALED_DFLASH, QWEN36_SCALED_DFLASH["hidden_size"]),
        write_tiny_hybrid_target,
        write_tiny_hybrid_dflash,
    ),
    "qwen3.5-moe-scaled": (
        write_moe_target,
        lambda folder: write_draft(folder, QWEN35_MOE_SCALED_DFLASH, QWEN35_MOE_SCALED_DFLASH["hidden_size"]),
        write_tiny_moe_target,
        write_tiny_hybrid_dflash,
    ),
}
SHAPE_TAUS = {"qwen3.5-moe-scaled": (9.9,)}  # MiniCPM-V-4.7-35B-A3B-DSpark's published tokens per step
# --moe-designs: rows of one call (sequences x rows each)
MOE_ROWS = {"decode 1 x 1": 1, "decode 4 x 1": 4, "verify 1 x 16": 16, "verify 4 x 5": 20, "prefill 1 x 128": 128}


def timed(fn: Callable[[], object], repeats: int) -> tuple[float, float]:
    """(median, fastest) wall seconds of `repeats` calls, after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), min(times)


def spread(total: int, n: int) -> list[int]:
    """`total` rows over n sequences, as evenly as possible."""
    return [total // n + (s < total % n) for s in range(n)]


def target_call(model: PagedModel, rows: list[int], past: int, rng) -> None:
    """Sequence s runs rows[s] new rows after `past` cached tokens (the cache is rolled back every call); each row a
    1-row subsequence where the scheduler verifies so (PagedModel.row_subsequences)."""
    seqs = [part for s, r in enumerate(rows) for part in sequence_rows(s, past, r, model.row_subsequences)]
    total = sum(rows)
    model.run(
        seqs,
        {
            "input_ids": rng.integers(0, 150000, total),
            "position_ids": np.concatenate([np.arange(past, past + r) for r in rows]),
            "logits_indices": np.arange(total, dtype=np.int64),
        },
        [list(range(r)) for r in rows],  # a hybrid target reports states after every row, as when verifying
    )


def draft_call(drafter: BlockDrafter, blocks: list[int], past: int, context_rows: int, width: int, rng) -> None:
    """Sequence s runs `context_rows` context rows then a block of blocks[s] rows (blocks[s] - 1 candidates; 0 = no
    block, the sequence only hands over its context)."""
    seqs = [SequenceRows(s, past, context_rows + b) for s, b in enumerate(blocks)]
    tt = np.concatenate([np.r_[np.zeros(context_rows, np.int32), np.ones(b, np.int32)] for b in blocks])
    begins = np.cumsum([0] + [s.num_rows for s in seqs])
    candidates = np.concatenate([begins[s] + context_rows + np.arange(1, b) for s, b in enumerate(blocks)])
    total = int(begins[-1])
    drafter.model.run(
        seqs,
        {
            "input_ids": rng.integers(0, 150000, total),
            "token_type_ids": tt,
            "hidden_states": rng.standard_normal((total, width), np.float32),
            "position_ids": np.concatenate([np.arange(past, past + s.num_rows) for s in seqs]),
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
    for s in range(n if model.states is not None else 0):
        model.states.allocate(s)
    model.run(seqs, inputs)
    for s in range(n if model.states is not None else 0):
        model.states.keep(s, past - 1)  # later calls start from this state and never keep theirs (rolled back)


def host_per_step(n: int, with_draft: bool, shape: str = "qwen3-4b") -> float:
    """Host (Python) seconds per scheduler step at concurrency n on the tiny pair, the draft pinned to full blocks."""
    write_tiny_t, write_tiny_d = SHAPES[shape][2:]
    with tempfile.TemporaryDirectory() as tmp:
        tcfg, tw = load_target(Checkpoint.open(write_tiny_t(Path(tmp) / "t")))
        dcfg, dw = load_draft(Checkpoint.open(write_tiny_d(Path(tmp) / "d")))
        target = PagedModel(build_paged_target(tcfg, tw, dcfg.target_layer_ids))
        drafter = BlockDrafter(build_dflash_draft(dcfg, dw, tw)) if with_draft else None
        scheduler = Scheduler(target, drafter)
        k = drafter.max_candidates if drafter else None
        for s in range(n):
            scheduler.add_request(list(range(s, s + 32)), GenerationConfig(max_new_tokens=48, num_assistant_tokens=k))
        scheduler.run()
        return scheduler.metrics.host_s / scheduler.metrics.steps


def row_counts(lo: int, hi: int) -> list[int]:
    """The planner's row buckets between lo and hi, and both ends."""
    return sorted({lo, hi, *(int(b) for b in BUCKETS if lo < b < hi)})


def constant_acceptance(tau: float, positions: int = FULL) -> float:
    """a with a + a^2 + ... + a^positions = tau - 1 (bisection)."""
    lo, hi = 0.0, 1.0
    for _ in range(60):
        a = (lo + hi) / 2
        lo, hi = (a, hi) if sum(a**j for j in range(1, positions + 1)) < tau - 1 else (lo, a)
    return (lo + hi) / 2


def profile(a: float) -> AcceptanceStats:
    """Statistics so heavy that the planner's estimate of every position's acceptance is a."""
    weight = 1e9
    return AcceptanceStats(np.full(FULL, weight), np.full(FULL, a * weight))


class Costs:
    """The two models at one concurrency: measured call times over row counts, and the calls of any plan."""

    def __init__(self, target: PagedModel, drafter: BlockDrafter, n: int, args, rng):
        self.target, self.drafter, self.n, self.args, self.rng = target, drafter, n, args, rng
        self.width = drafter.tap_width
        for s in range(n):
            target.free(s)
            drafter.model.free(s)
        prefill(target, n, args.context, rng)
        prefill(drafter.model, n, args.context, rng, draft=True, width=self.width)
        ctx = args.tau_context
        # target: n rows (no proposal) to n * 16 (full blocks); draft: blocks of 2 rows (k = 1) to full blocks
        self.target_times = {r: self.verify(spread(r, n)) for r in row_counts(n, n * BLOCK)}
        self.draft_times = {r: self.draft(spread(r - n * ctx, n)) for r in row_counts(n * (ctx + 2), n * (ctx + BLOCK))}

    def verify(self, rows: list[int]) -> tuple[float, float]:
        return timed(lambda: self.verify_once(rows), TABLE_REPEATS)

    def draft(self, blocks: list[int]) -> tuple[float, float]:
        return timed(lambda: self.draft_once(blocks), TABLE_REPEATS)

    def verify_once(self, rows: list[int]) -> float:
        """Seconds of one target call, sequence s running rows[s] rows."""
        start = time.perf_counter()
        target_call(self.target, rows, self.args.context, self.rng)
        return time.perf_counter() - start

    def draft_once(self, blocks: list[int]) -> float:
        """Seconds of one draft call, sequence s running its context rows and a block of blocks[s] rows."""
        start = time.perf_counter()
        draft_call(self.drafter, blocks, self.args.context, self.args.tau_context, self.width, self.rng)
        return time.perf_counter() - start

    def speculation(self, host_s: float) -> Speculation:
        """A planner whose cost models hold the measured medians."""
        spec = Speculation(FULL, 1)
        for table, cost in ((self.target_times, spec.target_cost), (self.draft_times, spec.draft_cost)):
            for rows, (median, _) in table.items():
                cost.observe(rows, median)
        spec.host_s = host_s
        return spec


def plan_seconds(spec: Speculation, n: int, a: float, context_rows: int) -> tuple[list[int], float]:
    """The planner's draft lengths for n requests of acceptance a, and what one plan call costs the host."""
    free = [(profile(a), FULL) for _ in range(n)]
    ks = spec.plan(free, n, 0, context_rows, False)
    median, _ = timed(lambda: spec.plan(free, n, 0, context_rows, False), 20)
    return ks, median


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="qwen3-4b", choices=sorted(SHAPES))
    parser.add_argument("--weight-format", default="int8")
    parser.add_argument("--requests", default="1,4")
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--tau-context", type=int, default=4, help="context rows per sequence in a draft call")
    parser.add_argument("--target-precision", default="f32", help="target inference precision (f32 = exact)")
    parser.add_argument("--workdir", help="keep the random checkpoints here (default: a temporary folder)")
    parser.add_argument("--moe-designs", action="store_true", help="time the MoE routing designs on one layer")
    parser.add_argument("--moe-shrink", type=int, default=1, help="--moe-designs: divide experts and widths by this")
    harness.add_arguments(parser, rounds=5)
    args = parser.parse_args()
    if args.moe_designs:
        moe_designs(args)
        return
    root = Path(args.workdir or tempfile.mkdtemp(prefix="ovbuild_cost_"))
    rng = np.random.default_rng(0)
    harness.start("Cost model at real scale: a speculative step against a plain decode step")
    try:
        start = time.perf_counter()
        if not (root / "target" / "config.json").exists():
            SHAPES[args.shape][0](root / "target")
            SHAPES[args.shape][1](root / "draft")
        print(f"checkpoints ready in {time.perf_counter() - start:.0f} s ({root})", flush=True)
        policy = WeightPolicy(args.weight_format)
        tcfg, tw = load_target(Checkpoint.open(root / "target"))
        dcfg, dw = load_draft(Checkpoint.open(root / "draft"))
        start = time.perf_counter()
        target = PagedModel(
            build_paged_target(tcfg, tw, dcfg.target_layer_ids, policy),
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
        print(
            f"context {args.context} tokens per sequence; a draft call carries {args.tau_context} context rows per "
            f"sequence; speed-ups: median over {args.rounds} rounds of per-round ratios (floor: fastest calls)",
            flush=True,
        )
        results = [measure(target, drafter, n, args, rng) for n in (int(x) for x in args.requests.split(","))]
        print_table(results)
    finally:
        if not args.workdir:
            shutil.rmtree(root, ignore_errors=True)


def measure(target: PagedModel, drafter: BlockDrafter, n: int, args, rng) -> list[dict]:
    """One concurrency: cost tables and plans, then rounds timing a plain decode step, a full-block step and every
    tau's planned step in a new order each; speed-ups are taken within each round, their median reported."""
    costs = Costs(target, drafter, n, args, rng)
    host_alone, host_spec = host_per_step(n, False, args.shape), host_per_step(n, True, args.shape)
    print_costs(costs, host_alone, host_spec)
    plans = []
    for tau in SHAPE_TAUS.get(args.shape, TAUS):
        a = constant_acceptance(tau)
        ks, plan_s = plan_seconds(costs.speculation(host_spec), n, a, n * args.tau_context)
        plans.append((tau, a, ks, plan_s, float(np.mean([1 + sum(a**j for j in range(1, k + 1)) for k in ks]))))
    steps = {"decode": [0] * n, "full": [FULL] * n} | {tau: ks for tau, _, ks, _, _ in plans}
    times: dict = {name: [] for name in steps}  # name -> [(verify, draft) per round]

    def step(ks: list[int]) -> harness.Measured:
        verify = costs.verify_once([k + 1 for k in ks])
        draft = costs.draft_once([k + 1 if k else 0 for k in ks]) if any(ks) else 0.0
        return harness.Measured(verify + draft, (verify, draft))

    cases = {name: functools.partial(step, ks) for name, ks in steps.items()}
    # the warm-up call of each case compiles every shape; then rounds in a new order each
    harness.interleave(cases, args.rounds, seed=args.seed + n, check=lambda name, vd: times[name].append(vd))
    t1 = np.array([v for v, _ in times["decode"]])  # [rounds]
    full = np.array([v + d for v, d in times["full"]])
    rows = []
    for tau, a, ks, plan_s, tau_k in plans:
        after = np.array([v + d for v, d in times[tau]])
        before_x = tau * (t1 + host_alone) / (full + host_spec)
        after_x = tau_k * (t1 + host_alone) / (after + host_spec + plan_s)
        verify_min, draft_min = (min(t[i] for t in times["full"]) for i in (0, 1))
        floor = tau * t1.min() / (verify_min + draft_min + host_spec)
        rows.append(
            {
                "n": n,
                "tau": tau,
                "a": a,
                "ks": ks,
                "tau_k": tau_k,
                "before": float(np.median(before_x)),
                "after": float(np.median(after_x)),
                "gain": float(np.median(after_x / before_x)),
                "floor": floor,
                "plan_ms": plan_s * 1e3,
            }
        )
    return rows


def print_costs(costs: Costs, host_alone: float, host_spec: float) -> None:
    def line(table: dict) -> str:
        return "  ".join(f"{r}:{m * 1e3:.1f}" for r, (m, _) in table.items())

    print(f"\nn = {costs.n}: milliseconds per call by rows (all sequences together)")
    print(f"  target {line(costs.target_times)}")
    print(f"  draft  {line(costs.draft_times)}")
    print(f"  host per step: alone {host_alone * 1e3:.2f}, with the draft {host_spec * 1e3:.2f}", flush=True)


def print_table(results: list[list[dict]]) -> None:
    print(
        f"\n{'n':>3} {'tau':>5} {'a':>6} {'k chosen':>10} {'tau(k)':>7} {'plan ms':>8} {'before':>8} {'after':>8} "
        f"{'after/before':>13} {'floor':>8}"
    )
    for row in (r for rows in results for r in rows):
        ks = sorted(set(row["ks"]))
        chosen = str(ks[0]) if len(ks) == 1 else f"{ks[0]}-{ks[-1]}"
        print(
            f"{row['n']:>3} {row['tau']:>5.1f} {row['a']:>6.3f} {chosen:>10} {row['tau_k']:>7.2f} "
            f"{row['plan_ms']:>8.3f} {row['before']:>7.2f}x {row['after']:>7.2f}x {row['gain']:>12.2f}x "
            f"{row['floor']:>7.2f}x"
        )


def compile_moe_design(weights: WeightSource, spec: MoeSpec, design: str, policy: WeightPolicy) -> ov.CompiledModel:
    """One MoE MLP (layer 0 of `weights`) alone, routed by `design`, compiled with f32 math."""
    x = opset16.parameter([-1, MOE_HIDDEN], ov.Type.f32, name="x")  # [T, H]: a bare layer, no IR port
    ctx = BuildContext(SimpleNamespace(hidden_size=MOE_HIDDEN), weights, policy, None, None)
    model = ov.Model([result(moe_mlp(ctx, 0, x.output(0), spec, design), "y")], [x], f"moe_{design}")
    return ov.Core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})


def moe_designs(args) -> None:
    """--moe-designs: every routing design on every row count of MOE_ROWS, in interleaved rounds; one table."""
    if args.weight_format not in ("int8", "int4"):
        raise SystemExit(f"--moe-designs times int8 or int4 experts, not {args.weight_format!r}")
    n = args.moe_shrink
    spec = dataclasses.replace(
        MOE_SPEC,
        num_experts=max(MOE_SPEC.top_k, MOE_SPEC.num_experts // n),
        expert_intermediate_size=MOE_SPEC.expert_intermediate_size // n,
        shared_intermediate_size=MOE_SPEC.shared_intermediate_size // n,
    )
    harness.start(
        f"MoE routing designs: one Qwen3.5-35B-A3B-style layer, {spec.num_experts} experts of "
        f"{spec.expert_intermediate_size} (shared {spec.shared_intermediate_size}), {spec.top_k} per token, "
        f"hidden {MOE_HIDDEN}"
    )
    # int4 groups of 128, or of the whole width when --moe-shrink makes it narrower (a group must divide it)
    policy = WeightPolicy(args.weight_format, sym=False, group_size=min(128, spec.shared_intermediate_size))
    with tempfile.TemporaryDirectory(prefix="ovbuild_moe_") as tmp:
        start = time.perf_counter()
        weights = write_moe_layer(Path(tmp), spec)
        requests = {d: compile_moe_design(weights, spec, d, policy).create_infer_request() for d in MOE_DESIGNS}
        print(f"layer written, built and compiled in {time.perf_counter() - start:.0f} s", flush=True)
        rng = np.random.default_rng(1)
        inputs = {name: rng.standard_normal((rows, MOE_HIDDEN)).astype(np.float32) for name, rows in MOE_ROWS.items()}

        def call(design: str, x: np.ndarray) -> np.ndarray:
            return requests[design].infer([x])[0].copy()  # the request reuses its output buffer on the next call

        cases = {(name, d): functools.partial(call, d, x) for name, x in inputs.items() for d in MOE_DESIGNS}
        rounds = harness.interleave(cases, args.rounds, seed=args.seed)  # the warm-up call compiles every shape
    # the same function by different ops, so not bit-equal: their largest difference is reported
    agree = max(
        float(np.abs(rounds.outputs[(name, "dense")] - rounds.outputs[(name, "gather")]).max()) for name in MOE_ROWS
    )
    print(
        f"\n{args.weight_format} experts; median ms over {args.rounds} rounds; designs agree to {agree:.1e} (max abs)"
    )
    print(f"{'rows':<18}" + "".join(f"{d:>10}" for d in MOE_DESIGNS) + f"{'dense / gather':>16}")
    for name in MOE_ROWS:
        med = "".join(f"{rounds.median((name, d)) * 1e3:>10.2f}" for d in MOE_DESIGNS)
        print(f"{name:<18}{med}{rounds.ratio((name, 'dense'), (name, 'gather')).median:>16.2f}")


if __name__ == "__main__":
    main()

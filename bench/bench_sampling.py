"""Where sampling's logits live, at vocabulary 151,936: host numpy on the verified rows' logits vs sampling inside
the graph with host-supplied uniforms (softmax + CumSum) or host-supplied Gumbel noise (argmax).

The target IR already returns `logits` [R, V] of the `logits_indices` rows next to `greedy_ids`, and the scheduler
reads outputs without copying, so the greedy path pays nothing for them; the question is what a sampling request
costs per verified row. Prints the median time of each way side by side.

    python bench/bench_sampling.py [--vocab 151936] [--rows 1,8,16] [--repeats 30]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import openvino as ov
import openvino.opset16 as ops

from ovbuild.graph.ops import argmax, i64
from ovbuild.runtime.sampling import SamplingParams, position_uniforms, processed_probs, race
from ovbuild.runtime.verify import verify_sampled

HOST_SETTINGS = {
    "T=0.7": SamplingParams(0.7),
    "T=0.7 top-k 50": SamplingParams(0.7, top_k=50),
    "T=0.7 top-p 0.9": SamplingParams(0.7, top_p=0.9),
    "T=1 top-k 50 top-p 0.9": SamplingParams(1.0, top_k=50, top_p=0.9),
}


def median_ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def host_sample(logits: np.ndarray, params: SamplingParams) -> list[int]:
    p = processed_probs(logits, params)
    return [race(row, position_uniforms(params.rng_seed, i, row.shape[-1]).token) for i, row in enumerate(p)]


def in_graph_inverse_cdf(vocab: int) -> ov.CompiledModel:
    """logits [R, V], 1/T [], u [R] -> token [R]: count of CDF entries <= u * total."""
    logits = ops.parameter([-1, vocab], ov.Type.f32)
    inv_t = ops.parameter([], ov.Type.f32)
    u = ops.parameter([-1], ov.Type.f32)
    p = ops.softmax(ops.multiply(logits, inv_t), -1)  # [R, V]
    cdf = ops.cumsum(p, i64(1))  # [R, V]
    total = ops.gather(cdf, i64([vocab - 1]), i64(1))  # [R, 1]
    below = ops.less_equal(cdf, ops.multiply(ops.unsqueeze(u, i64(1)), total))  # [R, V]
    token = ops.reduce_sum(ops.convert(below, ov.Type.i64), i64(1), False)  # [R]
    model = ov.Model([token], [logits, inv_t, u])
    return ov.Core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})


def in_graph_gumbel(vocab: int) -> ov.CompiledModel:
    """logits [R, V], 1/T [], gumbel [R, V] -> argmax(logits / T + gumbel) [R]."""
    logits = ops.parameter([-1, vocab], ov.Type.f32)
    inv_t = ops.parameter([], ov.Type.f32)
    noise = ops.parameter([-1, vocab], ov.Type.f32)
    model = ov.Model([argmax(ops.add(ops.multiply(logits, inv_t), noise), "sample")], [logits, inv_t, noise])
    return ov.Core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})


def measure(logits: np.ndarray, u: np.ndarray, inverse_cdf, gumbel, repeats: int) -> list[float]:
    """Median ms of each way on the same logits [R, V]."""
    times = [median_ms(lambda s=s: host_sample(logits, s), repeats) for s in HOST_SETTINGS.values()]
    draft = [int(np.argmax(logits[0])), -1]  # accepted, then a token with no mass: the walk stops at row 1
    times.append(median_ms(lambda: verify_sampled(logits, draft, None, SamplingParams(0.7), 0), repeats))
    times.append(median_ms(lambda: inverse_cdf([logits, np.float32(1 / 0.7), u]), repeats))

    def gumbel_call():
        noise = -np.log(-np.log(np.random.default_rng(1).random(logits.shape, np.float32)))
        return gumbel([logits, np.float32(1 / 0.7), noise])

    times.append(median_ms(gumbel_call, repeats))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--rows", default="1,8,16")
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    inverse_cdf, gumbel = in_graph_inverse_cdf(args.vocab), in_graph_gumbel(args.vocab)
    ways = [*HOST_SETTINGS, "verify K=15, 2 rows read", "graph: u + CumSum", "graph: Gumbel (+ host noise)"]
    print(f"vocab {args.vocab}; ms per call (median of {args.repeats}); host = ovbuild.runtime.sampling on numpy")
    print(f"{'rows':>5} " + " ".join(f"{w:>24}" for w in ways))
    for rows in (int(r) for r in args.rows.split(",")):
        # LM-like logits: a few strong candidates over a long flat tail
        logits = (rng.standard_normal((rows, args.vocab)) * 2).astype(np.float32)
        logits[:, :8] += 12
        times = measure(logits, rng.random(rows).astype(np.float32), inverse_cdf, gumbel, args.repeats)
        print(f"{rows:>5} " + " ".join(f"{t:24.2f}" for t in times))


if __name__ == "__main__":
    main()

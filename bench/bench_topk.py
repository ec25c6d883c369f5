"""Selection over the vocabulary in the graph: argmax and Top-K, each way timed side by side in one run.

Every paged graph ends in an argmax (`greedy_ids`, the DSpark chain) and the Markov heads take a Top-K of every
candidate row, so their cost is paid on every call. The script compiles each way on the CPU for rows x vocabulary
blocks and prints the median time of a call holding only that op (next to a call of a trivial op, the bare overhead):
argmax as TopK(k=1), stable or not, against ovbuild's ReduceMax/Equal/Select/ReduceMin pattern, and TopK(K) stable
against not stable (the lattice's choice).

    python bench/bench_topk.py [--vocab 4096,151936] [--rows 1,8,64] [--top-k 8] [--repeats 200]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import openvino as ov
import openvino.opset16 as ops

from ovbuild.graph.ops import argmax, i64


def topk(x: ov.Output, k: int, stable: bool) -> ov.Output:
    return ops.topk(x, i64(k), -1, "max", "value" if stable or k > 1 else "none", ov.Type.i64, stable=stable).output(1)


def argmax_ways() -> dict:
    return {
        "call overhead": lambda x: ops.reduce_min(ops.gather(x, i64([0]), i64(1)), i64([-1]), False),
        "TopK": lambda x: ops.squeeze(topk(x, 1, stable=False), i64([1])),
        "TopK stable": lambda x: ops.squeeze(topk(x, 1, stable=True), i64([1])),
        "ovbuild argmax": lambda x: argmax(x, "argmax"),
    }


def topk_ways(k: int) -> dict:
    return {f"TopK({k})": lambda x: topk(x, k, stable=False), f"TopK({k}) stable": lambda x: topk(x, k, stable=True)}


def median_ms(build, rows: int, vocab: int, repeats: int) -> tuple[float, np.ndarray]:
    x = ops.parameter([-1, vocab], ov.Type.f32)
    compiled = ov.Core().compile_model(ov.Model([build(x.output(0))], [x]), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    request = compiled.create_infer_request()
    data = np.random.default_rng(0).standard_normal((rows, vocab), dtype=np.float32)
    times = []
    for i in range(repeats + 10):
        start = time.perf_counter()
        request.infer([data])
        if i >= 10:
            times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3, request.get_output_tensor(0).data.copy()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", default="4096,151936")
    parser.add_argument("--rows", default="1,8,64")
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    for ways in (argmax_ways(), topk_ways(args.top_k)):
        print(f"{'vocab':>7} {'rows':>5} " + " ".join(f"{name:>15}" for name in ways) + "   (ms per call, median)")
        for vocab in (int(v) for v in args.vocab.split(",")):
            for rows in (int(r) for r in args.rows.split(",")):
                results = {name: median_ms(build, rows, vocab, args.repeats) for name, build in ways.items()}
                ids = [r[1] for name, r in results.items() if name != "call overhead"]
                line = " ".join(f"{results[name][0]:15.3f}" for name in ways)
                print(f"{vocab:>7} {rows:>5} {line}   same ids: {all(np.array_equal(i, ids[0]) for i in ids)}")


if __name__ == "__main__":
    main()

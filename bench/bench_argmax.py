"""In-graph argmax over the vocabulary: TopK(k=1) against ovbuild's ReduceMax/Equal/Select/ReduceMin pattern.

Every paged graph ends in an argmax (`greedy_ids`, the DSpark chain), so its cost is paid on every call. The script
compiles each way on the CPU for rows x vocabulary blocks and prints, side by side in one run, the median time of a
call holding only that op (the bare call overhead measured with an Identity-like model is printed too).

    python bench/bench_argmax.py [--vocab 4096,151936] [--rows 1,8,64] [--repeats 200]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import openvino as ov
import openvino.opset16 as ops

from ovbuild.graph.ops import argmax, i64


def topk(x: ov.Output, stable: bool) -> ov.Output:
    top = ops.topk(x, i64(1), -1, "max", "value" if stable else "none", ov.Type.i64, stable=stable)
    return ops.squeeze(top.output(1), i64([1]))


WAYS = {
    "call overhead": lambda x: ops.reduce_min(ops.gather(x, i64([0]), i64(1)), i64([-1]), False),
    "TopK": lambda x: topk(x, stable=False),
    "TopK stable": lambda x: topk(x, stable=True),
    "ovbuild argmax": lambda x: argmax(x, "argmax"),
}


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
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    print(f"{'vocab':>7} {'rows':>5} " + " ".join(f"{name:>15}" for name in WAYS) + "   (ms per call, median)")
    for vocab in (int(v) for v in args.vocab.split(",")):
        for rows in (int(r) for r in args.rows.split(",")):
            results = {name: median_ms(build, rows, vocab, args.repeats) for name, build in WAYS.items()}
            ids = {name: r[1] for name, r in results.items() if name != "call overhead"}
            agree = all(np.array_equal(v, ids["ovbuild argmax"]) for v in ids.values())
            line = " ".join(f"{results[name][0]:15.3f}" for name in WAYS)
            print(f"{vocab:>7} {rows:>5} {line}   same ids: {agree}")


if __name__ == "__main__":
    main()

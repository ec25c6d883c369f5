"""The delta rule of a hybrid target's linear layer: ovbuild's opset Loop against OpenVINO's internal GatedDeltaNet op.

At a Qwen3.6/3.8-like layer (48 value heads, key and value heads of 128) this times, side by side in one process,
the recurrence alone on the same [sequences, steps] inputs: decode (4 sequences x 1 row), verification (4 x 5 rows)
and a prefill chunk (1 x 256 rows). The Loop form also reports the state after every state row (here: each
sequence's last row); the op reports only the final state, which is why the graph does not use it (docs/hybrid.md).
The op has no Python constructor: it is written into an IR by hand and read back (the CPU plugin knows it).

    python bench/bench_hybrid.py [--calls 10] [--heads 48] [--dim 128]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import openvino as ov

from ovbuild.graph.gated_delta import StepGrid, delta_rule_loop, step_grid
from ovbuild.graph.ir import core
from ovbuild.graph.ops import parameter, result
from ovbuild.runtime.machine import describe

CASES = {"decode 4 x 1": (4, 1), "verify 4 x 5": (4, 5), "prefill 1 x 256": (1, 256)}


def loop_model(heads: int, dk: int, dv: int) -> ov.Model:
    names = {"q": dk, "k": dk, "v": dv}
    grid_inputs = [parameter(n, [-1, -1, heads, d], ov.Type.f32) for n, d in names.items()]
    g, beta = (parameter(n, [-1, -1, heads], ov.Type.f32) for n in ("g", "beta"))
    state = parameter("state", [-1, heads, dk, dv], ov.Type.f32)
    begins = parameter("subsequence_begins", [-1], ov.Type.i32)
    rows = parameter("rows", [-1], ov.Type.i64)
    state_rows = parameter("state_rows", [-1], ov.Type.i64)
    grid: StepGrid = step_grid(begins.output(0), state_rows.output(0), rows.output(0))
    q, k, v = (p.output(0) for p in grid_inputs)
    out, kept = delta_rule_loop(q, k, v, g.output(0), beta.output(0), state.output(0), grid, "bench")
    params = [*grid_inputs, g, beta, state, begins, rows, state_rows]
    return ov.Model([result(out, "out"), result(kept, "states")], params, "loop")


def op_model(folder: Path, heads: int, dk: int, dv: int) -> ov.Model:
    """An IR with one GatedDeltaNet op (version `extension`), written by hand."""
    ins = [("q", [-1, -1, heads, dk]), ("k", [-1, -1, heads, dk]), ("v", [-1, -1, heads, dv])]
    ins += [("state", [-1, heads, dk, dv]), ("g", [-1, -1, heads]), ("beta", [-1, -1, heads])]

    def dims(shape):
        return "".join(f"<dim>{d}</dim>" for d in shape)

    def text(shape):
        return ",".join("?" if d < 0 else str(d) for d in shape)

    layers = [
        f'<layer id="{i}" name="{n}" type="Parameter" version="opset1"><data shape="{text(s)}" '
        f'element_type="f32"/><output><port id="0" precision="FP32" names="{n}">{dims(s)}</port></output></layer>'
        for i, (n, s) in enumerate(ins)
    ]
    ports = "".join(f'<port id="{i}">{dims(s)}</port>' for i, (_, s) in enumerate(ins))
    out_shapes = ([-1, -1, heads, dv], [-1, heads, dk, dv])
    outs = "".join(f'<port id="{6 + j}" precision="FP32">{dims(s)}</port>' for j, s in enumerate(out_shapes))
    layers.append(
        '<layer id="6" name="gdn" type="GatedDeltaNet" version="extension"><data fuse_qk_l2norm="false" '
        f'q_l2_norm_eps="1e-06" k_l2_norm_eps="1e-06"/><input>{ports}</input><output>{outs}</output></layer>'
    )
    for j, (name, s) in enumerate(zip(("out", "final"), out_shapes, strict=True)):
        layers.append(
            f'<layer id="{7 + j}" name="{name}" type="Result" version="opset1"><input><port id="0">{dims(s)}</port>'
            "</input></layer>"
        )
    edges = "".join(f'<edge from-layer="{i}" from-port="0" to-layer="6" to-port="{i}"/>' for i in range(6))
    edges += '<edge from-layer="6" from-port="6" to-layer="7" to-port="0"/>'
    edges += '<edge from-layer="6" from-port="7" to-layer="8" to-port="0"/>'
    body = f"<layers>{''.join(layers)}</layers><edges>{edges}</edges>"
    xml = f'<?xml version="1.0"?>\n<net name="gdn" version="11">{body}</net>'
    path = folder / "gdn.xml"
    path.write_text(xml)
    return core().read_model(str(path))


def inputs(rng: np.random.Generator, s: int, length: int, heads: int, dk: int, dv: int) -> dict[str, np.ndarray]:
    def unit(shape):
        x = rng.standard_normal(shape).astype(np.float32)
        return x / np.linalg.norm(x, axis=-1, keepdims=True)

    return {
        "q": unit((s, length, heads, dk)) / np.float32(np.sqrt(dk)),
        "k": unit((s, length, heads, dk)),
        "v": rng.standard_normal((s, length, heads, dv)).astype(np.float32),
        "g": -rng.uniform(0, 1, (s, length, heads)).astype(np.float32),
        "beta": rng.uniform(0, 1, (s, length, heads)).astype(np.float32),
        "state": rng.standard_normal((s, heads, dk, dv)).astype(np.float32) * 0.1,
    }


def timed(request: ov.InferRequest, feed: dict[str, np.ndarray], calls: int) -> float:
    request.infer(feed)
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        request.infer(feed)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--heads", type=int, default=48)
    ap.add_argument("--dim", type=int, default=128)
    args = ap.parse_args()
    heads, dk, dv = args.heads, args.dim, args.dim
    print(describe())
    config = {"INFERENCE_PRECISION_HINT": "f32"}
    with tempfile.TemporaryDirectory() as tmp:
        loop = core().compile_model(loop_model(heads, dk, dv), "CPU", config).create_infer_request()
        op = core().compile_model(op_model(Path(tmp), heads, dk, dv), "CPU", config).create_infer_request()
    rng = np.random.default_rng(0)
    print(f"delta rule, {heads} value heads, dk = dv = {dk}; median of {args.calls} calls (ms)")
    print(f"{'case':<18} {'Loop':>8} {'GatedDeltaNet':>14} {'Loop / op':>10} {'max |diff|':>11}")
    for name, (s, length) in CASES.items():
        feed = inputs(rng, s, length, heads, dk, dv)
        # the op scales q by 1/sqrt(dk) itself; the Loop takes q scaled, as the graph builds it
        op_feed = {**feed, "q": feed["q"] * np.float32(np.sqrt(dk))}
        loop_feed = {
            **feed,
            "subsequence_begins": np.arange(0, (s + 1) * length, length, dtype=np.int32),
            "rows": np.zeros(s * length, np.int64),
            "state_rows": np.arange(length - 1, s * length, length, dtype=np.int64),
        }
        t_loop, t_op = timed(loop, loop_feed, args.calls), timed(op, op_feed, args.calls)
        diff = np.abs(loop.get_tensor("states").data - op.get_output_tensor(1).data).max()
        print(f"{name:<18} {t_loop:>8.2f} {t_op:>14.2f} {t_loop / t_op:>10.1f} {diff:>11.1e}")


if __name__ == "__main__":
    main()

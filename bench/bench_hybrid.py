"""The delta rule of a hybrid target's linear layer: ovbuild's chunked form and per-row opset Loop against OpenVINO's
internal GatedDeltaNet op.

At a Qwen3.6/3.8-like layer (48 value heads, key and value heads of 128) this times, interleaved in one process, the
recurrence alone on the same [sequences, steps] inputs: decode (4 sequences x 1 row), verification (4 x 5 rows, the
states after every row), prefill chunks (1 x 256, 1 x 512 rows, the state after the last row) and a call packing
both (the grid is [5, 512]). ovbuild's forms report the state after every state row; the op reports only the final
state, which is why the graph does not use it (docs/hybrid.md). The op has no Python constructor: it is written into
an IR by hand and read back (the CPU plugin knows it). Columns form-Loop and op-Loop: the largest state difference
from the Loop's (any of ovbuild's other forms; the op, for the sequences of L rows).

    python bench/bench_hybrid.py [--calls 10] [--heads 48] [--dim 128] [--chunks 16,32,64]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import openvino as ov

from ovbuild.graph.gated_delta import delta_rule_loop
from ovbuild.graph.gated_delta_chunked import CHUNK, delta_rule_chunked
from ovbuild.graph.ops import parameter, result
from ovbuild.graph.step_grid import StepGrid, step_grid
from ovbuild.ir import core
from ovbuild.runtime.machine import describe

# groups of (sequences, rows each, states after every row (verification) or after the last (prefill, decode))
CASES = {
    "decode 4 x 1": [(4, 1, False)],
    "verify 4 x 5": [(4, 5, True)],
    "prefill 1 x 256": [(1, 256, False)],
    "prefill 1 x 512": [(1, 512, False)],
    "4 x 5 + 1 x 512": [(4, 5, True), (1, 512, False)],
}


def rule_model(heads: int, dk: int, dv: int, form: str) -> ov.Model:
    """One of ovbuild's forms, with the states after the state rows: "Loop" (one iteration per row) or "chunk N"
    (chunks of N rows; the hybrid target's graph runs chunks of gated_delta_chunked.CHUNK)."""
    names = {"q": dk, "k": dk, "v": dv}
    grid_inputs = [parameter(n, [-1, -1, heads, d], ov.Type.f32) for n, d in names.items()]
    g, beta = (parameter(n, [-1, -1, heads], ov.Type.f32) for n in ("g", "beta"))
    state = parameter("state", [-1, heads, dk, dv], ov.Type.f32)
    begins = parameter("subsequence_begins", [-1], ov.Type.i32)
    rows = parameter("rows", [-1], ov.Type.i64)
    state_rows = parameter("state_rows", [-1], ov.Type.i64)
    grid: StepGrid = step_grid(begins.output(0), state_rows.output(0), rows.output(0))
    q, k, v = (p.output(0) for p in grid_inputs)
    args = (q, k, v, g.output(0), beta.output(0), state.output(0), grid, "bench")
    if form == "Loop":
        out, kept = delta_rule_loop(*args)
    else:
        out, kept = delta_rule_chunked(*args, chunk=int(form.split()[1]))
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


def interleaved(requests: dict[str, ov.InferRequest], feeds: dict[str, dict], calls: int) -> dict[str, float]:
    """Median ms of each request over `calls` rounds, one call of each per round (after a warm-up call)."""
    times: dict[str, list[float]] = {name: [] for name in requests}
    for name, request in requests.items():
        request.infer(feeds[name])
    for _ in range(calls):
        for name, request in requests.items():
            start = time.perf_counter()
            request.infer(feeds[name])
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) * 1e3 for name, t in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--heads", type=int, default=48)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--chunks", default=str(CHUNK), help="comma list of chunk sizes (powers of two); ratios: the first")
    ap.add_argument("--cases", default=",".join(CASES), help="comma list of: " + ", ".join(CASES))
    args = ap.parse_args()
    heads, dk, dv = args.heads, args.dim, args.dim
    chunks = [int(c) for c in args.chunks.split(",")]
    print(describe())
    config = {"INFERENCE_PRECISION_HINT": "f32"}
    forms = ["Loop", *(f"chunk {c}" for c in chunks)]
    chunked = forms[1]  # the ratios are this one's
    compiled = {form: rule_model(heads, dk, dv, form) for form in forms}
    with tempfile.TemporaryDirectory() as tmp:
        compiled["op"] = op_model(Path(tmp), heads, dk, dv)
        requests = {n: core().compile_model(m, "CPU", config).create_infer_request() for n, m in compiled.items()}
    rng = np.random.default_rng(0)
    print(f"delta rule, {heads} value heads, dk = dv = {dk}; median of {args.calls} interleaved calls (ms)")
    names = list(requests)
    print(
        f"{'case':<18} "
        + " ".join(f"{n:>9}" for n in names)
        + f" {'Loop/chunk':>10} {'chunk/op':>9} {'form-Loop':>10} {'op-Loop':>9}"
    )
    for case in args.cases.split(","):
        lengths = [rows for count, rows, _ in CASES[case] for _ in range(count)]
        every = [every_row for count, _, every_row in CASES[case] for _ in range(count)]
        s, length = len(lengths), max(lengths)
        feed = inputs(rng, s, length, heads, dk, dv)  # the [S, L] grid: cells past a sequence's end are unused
        # the op scales q by 1/sqrt(dk) itself; ovbuild's forms take q scaled, as the graph builds it
        op_feed = {**feed, "q": feed["q"] * np.float32(np.sqrt(dk))}
        begins = np.cumsum([0, *lengths])
        state_rows = [
            r for i, e in enumerate(every) for r in range(begins[i] if e else begins[i + 1] - 1, begins[i + 1])
        ]
        rule_feed = {
            **feed,
            "subsequence_begins": begins.astype(np.int32),
            "rows": np.zeros(begins[-1], np.int64),
            "state_rows": np.array(state_rows, np.int64),
        }
        ms = interleaved(requests, {n: op_feed if n == "op" else rule_feed for n in names}, args.calls)
        loop_states = requests["Loop"].get_tensor("states").data
        diff = max(float(np.abs(requests[n].get_tensor("states").data - loop_states).max()) for n in names[1:-1])
        # the op runs every sequence for L steps: its final states are comparable for the sequences of L rows
        full = [i for i, n in enumerate(lengths) if n == length]
        last = [state_rows.index(begins[i + 1] - 1) for i in full]
        op_diff = np.abs(requests["op"].get_output_tensor(1).data[full] - loop_states[last]).max()
        row = " ".join(f"{ms[n]:>9.2f}" for n in names)
        ratios = f"{ms['Loop'] / ms[chunked]:>10.1f} {ms[chunked] / ms['op']:>9.2f}"
        print(f"{case:<18} {row} {ratios} {diff:>10.1e} {op_diff:>9.1e}")


if __name__ == "__main__":
    main()

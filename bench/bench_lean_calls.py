"""How a call's inputs reach the infer request and its outputs come back: InferRequest.infer(dict); new tensors set by
input index and a bare infer() (PagedModel.run until stop 24); and PagedModel.run's InputBinder, which writes a call's
inputs into the buffers already bound when their shapes are the previous call's, then either start_async + wait or
infer(share_outputs=True), PagedModel.run's way (a bare infer() copies every output). On the shipped demo target (a
1-row decode call and an 8-row verification call) and on a model that does nothing with the same inputs (the binding
alone). Side by side in one process, interleaved rounds in shuffled order, median.

Then a decode step's host side alone (its PagedAttention layout and the binding of every input), each timed right after
a target call as the scheduler runs it, for 1, 4 and 32 sequences: the inputs as numpy arrays (until stop 26) against
plain lists, which the binder writes straight into its buffers and skips when they equal the last call's.

    python bench/bench_lean_calls.py [--rounds 15] [--calls 100]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import openvino as ov
import openvino.opset16 as ops

from ovbuild.demo import shipped_pair
from ovbuild.export import export
from ovbuild.ir import core, read_ir
from ovbuild.runtime.binding import InputBinder
from ovbuild.runtime.kv_cache import SequenceRows
from ovbuild.runtime.machine import describe
from ovbuild.runtime.paged_model import PagedModel

CONTEXT = 48  # tokens in the cache before each timed call


def call_inputs(model: PagedModel, rows: int) -> dict[str, np.ndarray]:
    """A call of `rows` rows after CONTEXT cached tokens: model inputs plus the PagedAttention layout."""
    inputs = {
        "input_ids": np.full(rows, 5, np.int64),
        "position_ids": np.arange(CONTEXT, CONTEXT + rows),
        "logits_indices": np.arange(rows),
    }
    layout = model.cache.layout([SequenceRows(0, CONTEXT, rows)])
    return inputs | {name: np.array(value, np.int32) for name, value in layout.items()}  # arrays, as every way takes


def dict_infer(request: ov.InferRequest, binder: InputBinder, dtypes: dict, feeds: dict[str, np.ndarray]) -> None:
    """Every input dispatched by InferRequest.infer's Python helpers."""
    request.infer(feeds, share_inputs=True, share_outputs=True)


def tensors_infer(request: ov.InferRequest, binder: InputBinder, dtypes: dict, feeds: dict[str, np.ndarray]) -> None:
    """PagedModel.run's previous binding: a new tensor per input set by index, then infer() (which copies outputs)."""
    for name, value in feeds.items():
        tensor = ov.Tensor(np.require(value, dtypes[name], "C"), shared_memory=True)
        request.set_input_tensor(binder.index[name], tensor)
    request.infer()


def binder_infer(request: ov.InferRequest, binder: InputBinder, dtypes: dict, feeds: dict[str, np.ndarray]) -> None:
    """PagedModel.run's binding and call (outputs as views)."""
    binder.bind(feeds)
    request.infer(share_outputs=True).to_tuple()


def binder_async(request: ov.InferRequest, binder: InputBinder, dtypes: dict, feeds: dict[str, np.ndarray]) -> None:
    """The binding, then start_async + wait, which copies no output either but hands the call to another thread."""
    binder.bind(feeds)
    request.start_async()
    request.wait()


def host_side(target: PagedModel, sequences: int, rounds: int) -> dict[str, float]:
    """Median seconds of one decode step's layout + binding, timed right after a target call (cold caches), with the
    inputs as arrays and as lists; bound to spare requests so that the timed calls keep their own binding."""
    binders = {
        kind: InputBinder(target.compiled.create_infer_request(), target.compiled.inputs, set(target.cache.names))
        for kind in ("arrays", "lists")
    }
    for seq in range(1, sequences):
        target.cache.allocator.reserve(seq, 2 * CONTEXT)
    seconds = {kind: [] for kind in binders}
    for _ in range(rounds):
        for step in range(CONTEXT):
            target.run([SequenceRows(0, CONTEXT, 1)], call_inputs_only(1))
            kind = random.choice(list(binders))
            rows = [SequenceRows(seq, CONTEXT + step, 1) for seq in range(sequences)]
            start = time.perf_counter()
            feeds = {
                "input_ids": [5] * sequences,
                "position_ids": [CONTEXT + step] * sequences,
                "logits_indices": list(range(sequences)),
            }
            feeds |= target.cache.layout(rows)
            if kind == "arrays":  # one array per input, as the scheduler and the layout made them until stop 26
                feeds = {
                    name: np.array(value, np.int64 if "_ids" in name else np.int32) for name, value in feeds.items()
                }
            binders[kind].bind(feeds)
            seconds[kind].append(time.perf_counter() - start)
    for seq in range(1, sequences):
        target.cache.allocator.free(seq)
    return {kind: statistics.median(values) for kind, values in seconds.items()}


def call_inputs_only(rows: int) -> dict[str, np.ndarray]:
    """The model inputs of a call of `rows` rows after CONTEXT cached tokens (PagedModel.run adds the layout)."""
    return {"input_ids": np.full(rows, 5), "position_ids": np.arange(CONTEXT, CONTEXT + rows), "logits_indices": [0]}


def empty_request(like: PagedModel) -> ov.InferRequest:
    """A model taking `like`'s non-cache inputs and computing next to nothing: what is left is the binding."""
    params = [
        ops.parameter(port.get_partial_shape(), port.get_element_type(), name=port.get_any_name())
        for port in like.compiled.inputs
        if port.get_any_name() in like.binder.index
    ]
    sums = [ops.reduce_sum(ops.convert(p, ov.Type.f32), ops.constant(np.zeros(0, np.int64)), False) for p in params]
    results = [ops.result(ops.shape_of(s)) for s in sums]  # every input is consumed, nothing is computed
    return core().compile_model(ov.Model(results, params, "bindings_only"), "CPU").create_infer_request()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=100)
    args = parser.parse_args()
    print(describe())
    with tempfile.TemporaryDirectory(prefix="ovbuild_lean_") as tmp:
        target_ckpt, draft_ckpt = shipped_pair()
        folder = export(target_ckpt, Path(tmp) / "target", draft_of=draft_ckpt, quiet=True).out
        target = PagedModel(read_ir(folder / "openvino_model.xml"), "CPU", "f16", "f32")
    prefix = call_inputs(target, CONTEXT)
    prefix |= {"position_ids": np.arange(CONTEXT), **target.cache.layout([SequenceRows(0, 0, CONTEXT)])}
    target.run([SequenceRows(0, 0, CONTEXT)], {k: prefix[k] for k in ("input_ids", "position_ids", "logits_indices")})
    cases = {
        "binding only": (empty_request(target), 1),
        "target 1 row": (target.request, 1),
        "target 8 rows": (target.request, 8),
    }
    ways = {
        "infer(dict)": dict_infer,
        "tensors + infer()": tensors_infer,
        "InputBinder + start_async/wait": binder_async,
        "InputBinder + infer(share_outputs)": binder_infer,
    }
    dtypes = {name: target.binder.dtypes[i] for name, i in target.binder.index.items()}
    seconds = {(case, way): [] for case in cases for way in ways}
    for _ in range(args.rounds):
        order = list(seconds)
        random.shuffle(order)
        for case, way in order:
            request, rows = cases[case]
            feeds = call_inputs(target, rows)
            # a new binder each time: the other ways set tensors behind the previous one's back
            binder = InputBinder(request, request.model_inputs, set(target.cache.names))
            times = []
            for _ in range(args.calls):
                start = time.perf_counter()
                ways[way](request, binder, dtypes, feeds)
                times.append(time.perf_counter() - start)
            seconds[case, way].append(statistics.median(times))
    print(f"median over {args.rounds} rounds of the median of {args.calls} calls (ms); ratios within each round")
    ours = "InputBinder + infer(share_outputs)"
    for case in cases:
        print(f"  {case}: " + "   ".join(f"{way} {statistics.median(seconds[case, way]) * 1e3:.3f}" for way in ways))
        for way in ways:
            if way != ours:
                pairs = zip(seconds[case, way], seconds[case, ours], strict=True)
                print(f"    {way} / {ours}: {statistics.median(x / y for x, y in pairs):.2f}x")
    print("\na decode step's layout + binding right after a target call (us, median):")
    for sequences in (1, 4, 32):
        host = host_side(target, sequences, max(args.rounds // 3, 3))
        print(f"  {sequences:>2} sequences: arrays {host['arrays'] * 1e6:5.1f}   lists {host['lists'] * 1e6:5.1f}")


if __name__ == "__main__":
    main()

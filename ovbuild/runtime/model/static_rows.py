"""Static row counts: a small model's calls run in copies of it compiled for fixed row counts.

The CPU plugin runs every node of a dynamic-shape model through its shape and memory checks on every call, even when
the shapes repeat, and a small model's calls are mostly that: on the demo target a call took 1.1x to 1.5x as long as
in a copy compiled for its row count, and the demo pair served 1.1x to 1.4x as fast with copies
(bench_static_rows.py, docs/speed.md). So a model small enough to copy runs each call padded up to the next of
COPY_ROWS rows, in a copy compiled for that row count when first needed; the copies share the model's KV cache
tensors, and only the row dimension is fixed (the PagedAttention layout and the logits rows stay dynamic).

Exactness: a row computes bitwise the same in every copy of 2 rows or more, whatever the other rows of its call, but
the dynamic model and a 1-row copy take other kernels (in f32 the dynamic model rounds a 1-row call differently from
a call of more rows too). So the smallest copy has 2 rows, every subsequence that fits the largest copy runs in one
(a call is cut into copy-sized parts at subsequence boundaries), and only a subsequence longer than that (a prompt
chunk) runs in the dynamic model: whether a row is computed in a copy depends on its own subsequence alone, never on
the call it came in, so speculative verification rows round as the target alone's decode rows do.
"""

from __future__ import annotations

import bisect
import time
import weakref

import numpy as np
import openvino as ov

from ovbuild.errors import UnsupportedError
from ovbuild.ir import core
from ovbuild.ir.ports import CACHES, INDEX_INPUTS, LAYOUT_INPUTS, ROW_INPUTS, ROW_OUTPUTS
from ovbuild.runtime.cache.kv_cache import SequenceRows
from ovbuild.runtime.model.binding import InputBinder

COPY_ROWS = (2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)  # about 1.5x apart: a call pads at most a third of its rows
# Each copy holds its own weights (the plugin repacks them per compiled model): a copy takes about twice its IR's
# weight bytes of memory where they stay narrow (ovbuild.runtime.model.narrow_weights), four times widened to f32.
# Copies still ran faster at 160 MB of weights, less so (bench_static_rows.py --widths, docs/speed.md), but models with
# more weights than this run dynamic only: 11 copies of them would cost more than a gigabyte.
MAX_WEIGHT_BYTES = 32 << 20


def weight_bytes(model: ov.Model) -> int:
    """Bytes of the model's constants (its weights, in the IR's precisions)."""
    return sum(op.get_byte_size() for op in model.get_ops() if op.get_type_name() == "Constant")


def copy_size(rows: int) -> int:
    """The row count of the copy a part of `rows` rows runs in (rows <= COPY_ROWS[-1])."""
    return COPY_ROWS[bisect.bisect_left(COPY_ROWS, rows)]


def padded_rows(rows: int) -> int:
    """The rows a call of `rows` rows computes in copies: its copy's, padding included; as asked past the largest copy
    (a longer subsequence runs in the dynamic model, see parts)."""
    return copy_size(rows) if rows <= COPY_ROWS[-1] else rows


def parts(rows: list[SequenceRows]) -> list[tuple[list[int], bool]]:
    """A call's subsequences (indices into `rows`) cut into parts: (indices, static). Subsequences longer than the
    largest copy go to one dynamic part; the others, in order, fill parts of at most COPY_ROWS[-1] rows."""
    limit = COPY_ROWS[-1]
    long = [i for i, r in enumerate(rows) if r.num_rows > limit]
    cut: list[tuple[list[int], bool]] = [(long, False)] if long else []
    part, filled = [], 0
    for i, r in enumerate(rows):
        if r.num_rows > limit:
            continue
        if filled + r.num_rows > limit:
            cut.append((part, True))
            part, filled = [], 0
        part.append(i)
        filled += r.num_rows
    if part:
        cut.append((part, True))
    return cut


class StaticCopies:
    """Copies of one model compiled per row count of COPY_ROWS on first use, all bound to the same KV cache tensors."""

    def __init__(self, source: ov.Model, model: ov.Model, compiled: ov.CompiledModel, device: str, config: dict, cache):
        """source: the model as the caller gave it; model: what `compiled` was compiled from (source, or a changed
        copy of it) with `config`; cache: the KV cache tensors by input name."""
        self.source, self.model, self.device, self.cache = source, model, device, cache
        self.config = {**compiled_properties(compiled, device), **config}
        self.copies: dict[int, tuple[ov.InferRequest, InputBinder]] = {}
        # Seconds the calls spent compiling copies and in each copy's first call: one-offs, which call costs leave
        # out. A copy allocates its memory in its first call: the demo target's first 3-row call took 24 ms against
        # 4 ms after, and, kept as a cost, made every verification of 3 rows or more look 2.5x slower than it was.
        self.compile_s = 0.0
        self.unrun: set[int] = set()  # copies compiled but not yet called

    def copy(self, rows: int) -> tuple[ov.InferRequest, InputBinder]:
        """The infer request and binder of the copy for `rows` rows (one of COPY_ROWS), compiled now if need be."""
        if rows not in self.copies:
            start = time.perf_counter()
            try:
                compiled = compiled_copy(self.source, self.model, self.device, self.config, rows)
            except (RuntimeError, MemoryError) as e:
                # mid-run (say, out of memory): one line naming the way out, not the plugin's traceback; no dynamic
                # fallback, whose rows round otherwise (see the module's docstring on exactness)
                reason = (str(e).strip().splitlines() or [type(e).__name__])[-1].strip()
                raise UnsupportedError(
                    f"the copy of '{self.source.get_friendly_name()}' for {rows} rows does not compile on "
                    f"{self.device} ({reason}); --static-rows off (ModelOptions.static_rows=False) runs it without "
                    "copies"
                ) from None
            request = compiled.create_infer_request()
            for name, tensor in self.cache.items():
                request.set_tensor(name, tensor)
            self.copies[rows] = (request, InputBinder(request, request.model_inputs, set(self.cache)))
            self.unrun.add(rows)
            self.compile_s += time.perf_counter() - start
        return self.copies[rows]

    def first_call(self, rows: int, seconds: float) -> None:
        """Count a copy's call as a one-off when it is the copy's first (see compile_s)."""
        if rows in self.unrun:
            self.unrun.discard(rows)
            self.compile_s += seconds


# Compiled copies of a caller's model, kept while that model object lives: the models compiled from one ov.Model the
# same way share them (a test's many schedulers over one model; they cost about 0.1-0.3 s each to compile).
_SHARED: weakref.WeakKeyDictionary[ov.Model, dict[tuple, ov.CompiledModel]] = weakref.WeakKeyDictionary()


def compiled_copy(source: ov.Model, model: ov.Model, device: str, config: dict, rows: int) -> ov.CompiledModel:
    """`model` compiled on `device` with `config` for `rows` rows, or the copy compiled so before from `source`."""
    shared = _SHARED.setdefault(source, {})
    key = (device, rows, *sorted((name, str(value)) for name, value in config.items()))
    if key not in shared:
        copy = model.clone()
        # [rows] or [rows, width]: only the row dimension is fixed
        copy.reshape({p.get_any_name(): [rows, *list(p.get_partial_shape())[1:]] for p in row_inputs(copy)})
        shared[key] = core().compile_model(copy, device, config)
    return shared[key]


def compiled_properties(compiled: ov.CompiledModel, device: str) -> dict:
    """The settable properties `compiled` runs with: copies compiled later must not pick up device settings changed
    since (a caller may set, say, DYNAMIC_QUANTIZATION_GROUP_SIZE on the core only while the model compiles)."""
    writable = {name for name, mode in core().get_property(device, "SUPPORTED_PROPERTIES").items() if mode == "RW"}
    properties = {name: compiled.get_property(name) for name in compiled.get_property("SUPPORTED_PROPERTIES")}
    # an empty set reads back where the device takes no empty value (MODEL_DISTRIBUTION_POLICY)
    return {name: value for name, value in properties.items() if name in writable and value != set()}


def row_inputs(model: ov.Model) -> list[ov.Output]:
    """The model's inputs with one entry per row."""
    return [p for p in model.inputs if p.get_any_name() in ROW_INPUTS]


def index_size(count: int, rows: int) -> int:
    """The index input's length in a copy of `rows` rows for a call naming `count` rows: the next power of two, at most
    `rows`. The plugin compiles kernels for each new length (the rows whose logits a call returns stay dynamic in a
    copy): on the demo draft a call of a new length took 1.4 to 7.5 ms where its calls take 0.8 ms. Few lengths are
    all seen before serving (see PagedModel.compile_copies)."""
    return min(1 << (count - 1).bit_length(), rows) if count > 0 else 0


def index_sizes(rows: int) -> list[int]:
    """Every index input length a copy of `rows` rows runs with."""
    return sorted({index_size(count, rows) for count in range(rows + 1)})


def pad_index(inputs: dict, size: int) -> dict:
    """`inputs` with each index input padded to `size` entries by repeating its last one (row 0 if empty): a row named
    twice is computed twice, and the extra outputs are cut off after the call."""
    padded = dict(inputs)
    for name in INDEX_INPUTS:
        if name in inputs:
            value = [int(i) for i in inputs[name]]
            padded[name] = value + (value[-1:] or [0]) * (size - len(value))
    return padded


def index_count(inputs: dict) -> int:
    """Rows the call's index input names (0 without one)."""
    return next((len(inputs[name]) for name in INDEX_INPUTS if name in inputs), 0)


def padding_only_inputs(ports: list[ov.Output]) -> dict[str, np.ndarray] | None:
    """The inputs (but the layout and caches) of a call of padding rows alone: every row and index input empty; None
    for a model with inputs such a call cannot fill."""
    inputs = {}
    for port in ports:
        name = port.get_any_name()
        if any(p.matches(name) for p in (*CACHES, *LAYOUT_INPUTS)):
            continue
        if name in ROW_INPUTS:
            width = [d.get_length() for d in list(port.get_partial_shape())[1:]]
            inputs[name] = np.zeros([0, *width], port.get_element_type().to_dtype())  # [0 rows, width...]
        elif name in INDEX_INPUTS:
            inputs[name] = np.zeros(0, np.int64)  # callers give it each length they warm (pad_index)
        else:
            return None
    return inputs


def part_inputs(inputs: dict, offsets: list[int], rows: list[SequenceRows], part: list[int]) -> tuple[dict, np.ndarray]:
    """The inputs of one part (the subsequences `part` of a call whose subsequence i starts at row offsets[i]), and
    the call's rows it holds, in order."""
    held = np.concatenate([np.arange(offsets[i], offsets[i] + rows[i].num_rows) for i in part])
    local = {}
    for name, value in inputs.items():
        if name in ROW_INPUTS:
            local[name] = np.asarray(value)[held]
        elif name in INDEX_INPUTS:
            index = np.asarray(value)
            local[name] = np.searchsorted(held, index[np.isin(index, held)])  # held is sorted: row -> its place
        else:
            local[name] = value
    return local, held


def merge(calls: list[tuple[np.ndarray, dict]], inputs: dict, total_rows: int) -> dict[str, np.ndarray]:
    """The outputs of a call cut into parts, from each part's (rows held, outputs): per-row outputs back in row order,
    the others in the order of the call's index input (logits_indices or candidate_indices)."""
    index = next((np.asarray(inputs[n]) for n in INDEX_INPUTS if n in inputs), np.zeros(0, np.int64))
    merged: dict[str, np.ndarray] = {}
    for held, outputs in calls:
        picked = np.isin(index, held)
        for name, value in outputs.items():
            if name not in merged:
                size = total_rows if name in ROW_OUTPUTS else len(index)
                merged[name] = np.empty((size, *value.shape[1:]), value.dtype)
            if name in ROW_OUTPUTS:
                merged[name][held] = value
            else:
                merged[name][picked] = value
    return merged

"""A compiled paged IR with its own KV cache: one `run` per packed call of many sequences."""

from __future__ import annotations

import functools
import time
import weakref

import numpy as np
import openvino as ov

from ovbuild.errors import UnsupportedError
from ovbuild.ir import core, gpu_activations_scale_factor
from ovbuild.ir.ports import CACHES, LOGITS, MROPE_OFFSETS, ROW_OUTPUTS, STATE_ROWS, TAPS
from ovbuild.runtime.cache.cache_manager import BlocksAndSlots, CacheManager
from ovbuild.runtime.cache.kv_cache import PagedKVCache, SequenceRows
from ovbuild.runtime.cache.state_pool import StatePool, state_specs
from ovbuild.runtime.model import machine
from ovbuild.runtime.model.binding import InputBinder
from ovbuild.runtime.model.executors import MIN_ROWS, choose_executor
from ovbuild.runtime.model.image_inputs import image_width, text_call
from ovbuild.runtime.model.machine import cpu_math, device_kind
from ovbuild.runtime.model.narrow_weights import narrow_weights
from ovbuild.runtime.model.padding import PAD_SEQUENCE, pad_inputs, padding_rows
from ovbuild.runtime.model.static_rows import (
    COPY_ROWS,
    MAX_WEIGHT_BYTES,
    StaticCopies,
    index_sizes,
    pad_index,
    padded_rows,
    padding_only_inputs,
    weight_bytes,
)

KV_PRECISIONS = ("u8", "f16", "bf16", "f32")
INFERENCE_PRECISIONS = ("f32", "bf16", "f16")  # INFERENCE_PRECISION_HINT values; None = the device default
# A hybrid target's linear-attention states take slots from the cache budget: enough for this many sequences, but at
# most STATE_SHARE of the budget (the KV blocks get the rest; admission waits for both).
DEFAULT_STATE_SLOTS = 32
STATE_SHARE = 0.5


def compile_config(
    kv_cache_precision: str = "u8",
    inference_precision: str | None = None,
    device: str = "CPU",
    model: ov.Model | None = None,
) -> dict[str, str]:
    """Plugin properties. An f32 KV cache needs f32 inference (CPUs with bf16 units otherwise demand a bf16 cache);
    a u8 cache on CPU quantizes keys per token (see below); on GPU, a model asking for a minimum
    ACTIVATIONS_SCALE_FACTOR (DFlash v2: fp16 overflows in its convs) gets it."""
    if kv_cache_precision not in KV_PRECISIONS:
        raise UnsupportedError(f"KV cache precision '{kv_cache_precision}' is not one of {', '.join(KV_PRECISIONS)}")
    config = {"KV_CACHE_PRECISION": kv_cache_precision}
    if inference_precision is None and kv_cache_precision == "f32":
        inference_precision = "f32"
    if inference_precision:
        config["INFERENCE_PRECISION_HINT"] = inference_precision
    if kv_cache_precision == "u8" and device_kind(device) == "CPU":
        # The CPU plugin's default quantizes keys per channel across a cache block, so a row written and then rolled
        # back shifts the scales of the committed rows around it: speculative output drifts from the target alone.
        # Per-token keys (values are per token already) leave committed rows as they were written: measured exact
        # against the target alone with the same cache, where the default diverged (bench/bench_kv_cache.py).
        config["KEY_CACHE_QUANT_MODE"] = "BY_TOKEN"
    if device_kind(device) == "CPU" and machine.isa_limit():
        # The plugin picks its default math (bf16) and int8 activation quantization for compressed layers from the
        # CPU's own flags, past oneDNN's ISA limit, then finds no kernel within it ("could not create a primitive
        # descriptor" on the first call). Ask for what a CPU without the extensions above the limit runs: f32 math
        # without bf16 units, and no quantized activations without VNNI or AMX.
        config.setdefault("INFERENCE_PRECISION_HINT", cpu_math(None))
        if not machine.has_int8_dot_product():
            config["DYNAMIC_QUANTIZATION_GROUP_SIZE"] = "0"
    scale = gpu_activations_scale_factor(model) if model is not None else None
    if device_kind(device) == "GPU" and scale is not None:
        config["ACTIVATIONS_SCALE_FACTOR"] = str(scale)
    return config


class PagedModel:
    """Compiled model + infer request + paged KV cache. Inputs other than the paged layout are given per call."""

    def __init__(
        self,
        model: ov.Model,
        device: str = "CPU",
        kv_cache_precision: str = "u8",
        inference_precision: str | None = None,
        *,
        cache_mb: float = 256,
        num_blocks: int | None = None,
        properties: dict[str, str] | None = None,
        state_slots: int | None = None,
        padding: tuple[int, float] | None = None,
        static_rows: bool | None = None,
        cache_from: PagedModel | None = None,
    ):
        """Compile `model`; its cache gets `num_blocks` blocks, or as many as fit in `cache_mb` megabytes;
        `properties` (plugin properties) override ovbuild's own. A model with linear-attention states
        (`conv_state.*`, `recurrent_state.*` inputs) gets a StatePool of `state_slots` sequences (None: from the
        budget, see DEFAULT_STATE_SLOTS). padding: (min_pad, share) of the RowPadding that runs a call of fewer rows
        than the recent ones padded up to their row count (ovbuild.runtime.model.padding); None = every call as it is.
        static_rows: whether calls run in copies compiled per row count (ovbuild.runtime.model.static_rows); None =
        where they are measured to pay, on CPU for a model without states and with at most MAX_WEIGHT_BYTES of weights.
        cache_from: a model of the same cache layout whose KV cache (tensors and blocks) this one shares."""
        self._options = (device, kv_cache_precision, inference_precision, properties)  # for the untapped sibling
        config = {**compile_config(kv_cache_precision, inference_precision, device, model), **(properties or {})}
        source = model  # the caller's: compiled copies are shared by the models compiled from it (static_rows)
        # outputs compiled in bf16, which run() widens to f32 (taps_in_math_precision)
        model, self.widened = taps_in_math_precision(model, device, config.get("INFERENCE_PRECISION_HINT"))
        model = narrow_weights(model, device, config.get("INFERENCE_PRECISION_HINT"))
        self.compiled = compile_paged(model, device, config, kv_cache_precision)
        self.request = self.compiled.create_infer_request()
        # a target that takes images: the width of its image_embeds (calls that name none are text calls)
        self.image_width = image_width(self.compiled.inputs)
        budget = cache_mb * 2**20
        self.states, budget = state_pool(self.compiled, budget, state_slots)
        if num_blocks is None:
            num_blocks = max(1, int(budget // block_bytes(self.compiled)))
        # Whether a sequence's rows may run as 1-row subsequences, each after the ones before it: the CPU plugin
        # writes every subsequence's keys and values before attending, so each row sees the rows before it, through
        # the kernel a 1-row decode runs. A k-row subsequence runs another kernel, which rounds differently in bf16:
        # speculative output diverged from the target alone's with bf16 math, and is identical with 1-row
        # subsequences (bench/bench_kv_cache.py). Untested on other devices; a hybrid target's states are per
        # sequence and step row by row in one subsequence.
        self.row_subsequences = device_kind(device) == "CPU" and self.states is None
        weights = weight_bytes(model)
        if static_rows is None:
            static_rows = self.row_subsequences and weights <= MAX_WEIGHT_BYTES
        elif static_rows and not self.row_subsequences:
            raise UnsupportedError("static row counts run on CPU, for a model without linear-attention states")
        # Padding rows have blocks of their own for good, beyond the budget's: the copies' (up to the largest copy),
        # and the one row that a dynamic model without row padding adds to a 1-row call (DynamicExecutor).
        pinned = (PAD_SEQUENCE, COPY_ROWS[-1]) if static_rows else None
        if not static_rows and padding is None and self.row_subsequences:
            pinned = (PAD_SEQUENCE, MIN_ROWS - 1)
        if cache_from is None:
            self.cache = PagedKVCache(self.compiled, self.request, num_blocks, pinned)
        else:
            self.cache = cache_from.cache
            for name, tensor in self.cache.tensors.items():
                self.request.set_tensor(name, tensor)
        # the cache's blocks (and a hybrid target's state slots), as the scheduler reserves and commits them: made once
        self.cache_manager: CacheManager = (
            self.cache.allocator if self.states is None else BlocksAndSlots(self.cache.allocator, self.states)
        )
        self.output_names = [o.get_any_name() for o in self.compiled.outputs]
        self.binder = InputBinder(self.request, self.compiled.inputs, set(self.cache.names))
        self.static: StaticCopies | None = None
        if static_rows:
            cache = {name: self.request.get_tensor(name) for name in self.cache.names}
            self.static = StaticCopies(source, model, self.compiled, device, config, cache)
        self.executor = choose_executor(self, padding)
        # Whether a caller may leave a call's taps untaken (decode rows while the planner idles, ovbuild.runtime.
        # scheduler): a model with static copies, whose calls are short enough that taking them counts. Each request
        # copies its rows every step (1.5 to 2 us a request on the losing pair of bench_runtime.py --losing, steps of
        # 0.4 to 1.3 ms), and such a model's catch-up of the rows it then missed is one short call. A bigger model
        # keeps them: taking them is microseconds on steps of a tenth of a second and more, where a catch-up of a
        # long idle's rows would take seconds. Prompt chunks keep theirs, so a request admitted meanwhile starts
        # without a gap.
        self.taps_optional = TAPS in self.output_names and self.static is not None and cache_from is None
        # Taps cost a small model's calls a few percent (on the demo target their outputs keep the plugin from fusing
        # each residual add with the next norm: 1.01x-1.06x per call, bench_untapped.py, docs/speed.md), and a call that
        # nobody takes them from can run without: in a sibling compiled without the taps output, on the same cache. Its
        # logits and cache rows are bitwise this model's (tests/test_untapped.py). Its copies cost as much memory as
        # this model's (a quarter of a gigabyte on the demo target), so only a model whose copies and the sibling's
        # together take no more than the largest model with copies alone gets one; a bigger model's taps cost less.
        # Not one for the 24-layer demo target either: with it, a request that drafts again first catches up on the
        # taps it missed, its prompt's among them (a sibling's call computes none), and one request at a time the
        # planner drafted in no step for half the rounds and served at 0.98x of the target alone, against 1.21x with
        # every call tapped (8 interleaved rounds, 2026-12-04).
        self.can_skip_taps = self.taps_optional and weights <= MAX_WEIGHT_BYTES // 2
        self._source, self._untapped, self._sibling_s = source, None, 0.0

    def compile_copies(self) -> None:
        """Compile every static copy now (the untapped sibling's too), rather than on the first call of its rows, and
        run its first call on padding rows alone, once at each length its index input takes: a copy allocates its
        memory in its first call (24 ms against 4 ms after, on the demo target; see StaticCopies.compile_s), and the
        plugin compiles kernels for each new index length (static_rows.index_size)."""
        if self.static is not None:
            blank = padding_only_inputs(self.compiled.inputs)
            for rows in COPY_ROWS:
                request, binder = self.static.copy(rows)
                if blank is None or rows not in self.static.unrun:
                    continue
                start = time.perf_counter()
                for size in index_sizes(rows):  # each length the copy's index input takes (see index_size)
                    self.infer([], pad_index(blank, size), None, request, binder, rows)
                self.static.first_call(rows, time.perf_counter() - start)
        if self.can_skip_taps:
            self.untapped().compile_copies()

    def computed_rows(self, rows: int) -> int:
        """Rows a call of `rows` rows computes: the row count of the static copy it runs in, padding included."""
        return padded_rows(rows) if self.static is not None else rows

    @property
    def compile_s(self) -> float:
        """Seconds the calls so far spent compiling (static copies, the untapped sibling) and in each copy's first call:
        one-offs, which call costs leave out."""
        own = self.static.compile_s if self.static is not None else 0.0
        return own + self._sibling_s + (self._untapped.compile_s if self._untapped is not None else 0.0)

    def untapped(self) -> PagedModel:
        """This model without its taps output, on the same cache (compiled on first use; see can_skip_taps)."""
        if self._untapped is None:
            start = time.perf_counter()
            device, kv_cache_precision, inference_precision, properties = self._options
            model = without_taps(self._source)
            self._untapped = PagedModel(
                model,
                device,
                kv_cache_precision,
                inference_precision,
                properties=properties,
                static_rows=True,
                cache_from=self,
            )
            self._sibling_s = time.perf_counter() - start
        return self._untapped

    def describe(self) -> str:
        """How the plugin compiled the model: device, math and KV cache precision, with the math asked for where it
        computes in another (a bf16 hint on a CPU without bf16 units runs in f32)."""
        device, _, asked, _ = self._options
        supported = self.compiled.get_property("SUPPORTED_PROPERTIES")

        def precision(name: str) -> str:
            return self.compiled.get_property(name).get_type_name() if name in supported else "?"

        math = precision("INFERENCE_PRECISION_HINT")
        note = f" ({asked} asked)" if asked and asked != math else ""
        return f"{device}, {math} math{note}, {precision('KV_CACHE_PRECISION')} KV cache"

    @functools.cached_property
    def vocab_size(self) -> int | None:
        """Width of the `logits` output: the token ids the model knows are 0..vocab_size-1 (None if not static). Kept:
        every request asks when it is added, and the compiled model's outputs took 0.2 ms to list."""
        port = next((o for o in self.compiled.outputs if o.get_any_name() == LOGITS), None)
        dim = port.get_partial_shape()[-1] if port is not None else None
        return dim.get_length() if dim is not None and dim.is_static else None

    def run(
        self,
        rows: list[SequenceRows],
        inputs: dict[str, np.ndarray],
        state_rows: list[list[int]] | None = None,
        taps: bool = True,
    ) -> dict[str, np.ndarray]:
        """One packed call: rows say which sequences are in it and where they stand; returns every output.
        With states: state_rows[s] are the rows of sequence s whose states may be kept after the call
        (`states.keep`; None: each sequence's last row); a caller that passes the state inputs itself (with
        `state_rows` among `inputs`) keeps the states itself, and the pool is left alone. With static copies the
        call may run as several parts (ovbuild.runtime.model.static_rows.parts), whose outputs come back merged: the
        executor chosen at construction (choose_executor) decides.
        taps=False: the caller does not read the taps, which the call may then leave out (see can_skip_taps)."""
        if not taps and self.can_skip_taps:
            return self.untapped().run(rows, inputs, state_rows)
        return self.executor.run(rows, inputs, state_rows)

    def infer(
        self,
        rows: list[SequenceRows],
        inputs: dict,
        state_rows: list[list[int]] | None,
        request: ov.InferRequest,
        binder: InputBinder,
        pad: int,
    ) -> dict[str, np.ndarray]:
        """One infer of `request` (this model's, or one of its static copies') with `pad` padding rows (their blocks
        reserved by the caller): the executors (ovbuild.runtime.model.executors) run every call through it."""
        real = sum(r.num_rows for r in rows)
        if self.image_width is not None and MROPE_OFFSETS not in inputs:
            inputs = inputs | text_call(real, self.image_width)
        if pad:
            rows, inputs = [*rows, padding_rows(pad)], pad_inputs(inputs, pad)
        layout = self.cache.layout(rows)
        pooled = self.states is not None and STATE_ROWS not in inputs
        if pooled:
            layout |= self.states.inputs(rows, state_rows)
        binder.bind(inputs | layout)
        # Outputs are views of the output tensors, valid until the next call: infer() alone copies every one of
        # them (logits: rows x vocab floats), and start_async + wait costs a thread hand-off
        # (bench_lean_calls.py, docs/speed.md)
        outputs = dict(zip(self.output_names, request.infer(share_outputs=True).to_tuple(), strict=True))
        for name in self.widened:
            outputs[name] = bf16_to_f32(outputs[name])
        if pad:
            outputs |= {name: outputs[name][:real] for name in ROW_OUTPUTS if name in outputs}
        if pooled:
            self.states.report(outputs)
        return outputs

    def free(self, seq_id: int) -> None:
        """Return the sequence's cache blocks (and its state slot)."""
        self.cache_manager.free(seq_id)


def compile_paged(model: ov.Model, device: str, config: dict, kv_cache_precision: str) -> ov.CompiledModel:
    """`model` compiled with `config`; a KV cache precision the device refuses is one line naming it."""
    try:
        return core().compile_model(model, device, config)
    except RuntimeError as e:
        if "kvcache type" not in str(e):
            raise
        # a device whose precisions ovbuild.runtime.model.devices does not predict: still one line, with the reason
        reason = str(e).strip().splitlines()[-1].strip()
        raise UnsupportedError(
            f"KV cache precision '{kv_cache_precision}' does not compile on {device} ({reason})"
        ) from None


def state_pool(compiled: ov.CompiledModel, budget: float, slots: int | None) -> tuple[StatePool | None, float]:
    """The StatePool of a model with linear-attention states (None without), and the cache budget left for the KV
    blocks; slots None: enough for DEFAULT_STATE_SLOTS sequences, within STATE_SHARE of the budget."""
    specs = state_specs(compiled)
    if not specs:
        return None, budget
    slot_bytes = StatePool.slot_bytes(specs)
    if slots is None:
        slots = max(1, min(DEFAULT_STATE_SLOTS, int(budget * STATE_SHARE // slot_bytes)))
    return StatePool(specs, slots), budget - slots * slot_bytes


def taps_in_math_precision(model: ov.Model, device: str, inference_precision: str | None) -> tuple[ov.Model, tuple]:
    """The model with its taps output (TAPS) in bf16 when the CPU plugin computes in bf16, and the outputs so changed.

    The plugin keeps in f32 every node between an f32 output and the matmuls before it: a target's taps, read from
    the residual stream of several layers, kept that whole stream in f32 up to the last tap (25 more nodes on the demo
    target), so the target exported for a draft computed other logits than the same target exported alone, and
    speculative output diverged from the target alone's. An output in the math precision starts no such f32 tail:
    the logits are then bitwise those of the target alone. A copy is changed: callers compile one model many ways."""
    names = {o.get_any_name() for o in model.outputs}
    if TAPS not in names or device_kind(device) != "CPU":
        return model, ()
    if cpu_math(inference_precision) != "bf16":
        return model, ()
    post = ov.preprocess.PrePostProcessor(model.clone())
    post.output(TAPS).tensor().set_element_type(ov.Type.bf16)
    return post.build(), (TAPS,)


# A model's untapped form, kept while the model object lives: the PagedModels compiled from one model share it, and
# with it their static copies (ovbuild.runtime.model.static_rows keys them by model).
_UNTAPPED: weakref.WeakKeyDictionary[ov.Model, ov.Model] = weakref.WeakKeyDictionary()


def without_taps(model: ov.Model) -> ov.Model:
    """A copy of the model without its taps output (TAPS): the same nodes, names and rt_info; what only the taps
    needed is left unreachable, and compiling drops it."""
    if model not in _UNTAPPED:
        copy = model.clone()
        for result in copy.get_results():
            if result.output(0).get_any_name() == TAPS:
                copy.remove_result(result)
        _UNTAPPED[model] = copy
    return _UNTAPPED[model]


def bf16_to_f32(values: np.ndarray) -> np.ndarray:
    """An output tensor holding bf16 as f32 (numpy has no bf16: the tensor's bits come as 16-bit numbers)."""
    # [rows, width] bf16 bits -> the high half of f32 numbers
    return (values.view(np.uint16).astype(np.uint32) << 16).view(np.float32)


def block_bytes(compiled: ov.CompiledModel) -> int:
    """Bytes one cache block takes across all layers' key and value caches, in the compiled precision."""
    total = 0
    for port in compiled.inputs:
        if port.get_any_name().startswith(CACHES):
            dims = [d.get_length() for d in list(port.get_partial_shape())[1:]]
            total += int(np.prod(dims)) * port.get_element_type().bitwidth // 8
    return max(total, 1)

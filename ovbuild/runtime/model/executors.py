"""Executors: how a PagedModel runs one packed call (as it is, padded up to a row count, or in static copies).

Each executor decides the call's padding rows and which compiled model runs it, then runs it through
PagedModel.infer; choose_executor picks one per model.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from itertools import accumulate
from typing import Protocol

import numpy as np
import openvino as ov

from ovbuild.ir.ports import ROW_OUTPUTS
from ovbuild.runtime.cache.kv_cache import PagedKVCache, SequenceRows
from ovbuild.runtime.cache.state_pool import StatePool
from ovbuild.runtime.model.binding import InputBinder
from ovbuild.runtime.model.padding import PAD_SEQUENCE, RowPadding
from ovbuild.runtime.model.static_rows import (
    StaticCopies,
    copy_size,
    index_count,
    index_size,
    merge,
    pad_index,
    part_inputs,
    parts,
)

# Rows a CPU model's call runs at least (padded up to them) where no copies or row padding set its row count: the
# plugin takes other kernels for a 1-row call than for more rows, at every weight precision (a Qwen3-4B-wide target's
# logits moved by up to 9e-6), whereas a row computes bitwise alike in any call of 2 rows or more. So the target
# alone's decode rounds as its verification rows do, and greedy speculation stays exact. At Qwen3-4B width the extra
# row cost nothing measurable: a decode reads every weight either way.
MIN_ROWS = 2


class PagedModel(Protocol):
    """What an executor runs its calls through: a PagedModel (ovbuild.runtime.model.paged_model), which picks its
    executor here, so this module names only the parts it uses and never imports it."""

    static: StaticCopies | None
    states: StatePool | None
    cache: PagedKVCache
    request: ov.InferRequest
    binder: InputBinder

    def infer(
        self,
        rows: list[SequenceRows],
        inputs: dict,
        state_rows: list[list[int]] | None,
        request: ov.InferRequest,
        binder: InputBinder,
        pad: int,
    ) -> dict[str, np.ndarray]: ...


class Executor(Protocol):
    """How a PagedModel runs one packed call: as it is, padded, or in static copies."""

    def run(self, rows: list[SequenceRows], inputs: dict, state_rows: list[list[int]] | None) -> dict: ...


def choose_executor(model: PagedModel, padding: tuple[int, float] | None) -> Executor:
    """Static copies where the model has them; else, except for a hybrid target, whose states are per sequence (a
    padding sequence would need their inputs), padded calls where asked, or calls of at least MIN_ROWS rows where the
    padding rows have blocks of their own; else calls as they are."""
    if model.static is not None:
        return StaticExecutor(model)
    if model.states is not None:
        return DynamicExecutor(model)
    if padding is not None:
        return PaddedExecutor(model, RowPadding(*padding))
    pinned = PAD_SEQUENCE in model.cache.allocator.pinned  # none on a cache shared from another model
    return DynamicExecutor(model, MIN_ROWS if pinned else 1)


@dataclass
class DynamicExecutor:
    """Every call in the dynamic-shape model, as it is or padded up to min_rows rows."""

    model: PagedModel
    min_rows: int = 1

    def run(self, rows: list[SequenceRows], inputs: dict, state_rows: list[list[int]] | None) -> dict:
        m, real = self.model, sum(r.num_rows for r in rows)
        pad = self.min_rows - real if 0 < real < self.min_rows else 0
        return m.infer(rows, inputs, state_rows, m.request, m.binder, pad)


@dataclass
class PaddedExecutor:
    """Calls of fewer rows than the recent ones padded up to their row count (ovbuild.runtime.model.padding)."""

    model: PagedModel
    padding: RowPadding

    def run(self, rows: list[SequenceRows], inputs: dict, state_rows: list[list[int]] | None) -> dict:
        m = self.model
        real = sum(r.num_rows for r in rows)
        pad = self.padding.rows(real) - real
        if pad and not m.cache.allocator.can_hold(PAD_SEQUENCE, pad):
            pad = 0  # no free blocks for it: the call runs as it is
        try:
            return m.infer(rows, inputs, state_rows, m.request, m.binder, pad)
        finally:
            if pad:
                m.cache.allocator.free(PAD_SEQUENCE)


@dataclass
class StaticExecutor:
    """Calls cut into parts at subsequence boundaries, each run in the copy compiled for its row count (padded up to
    it), or in the dynamic model for a subsequence longer than the largest copy (ovbuild.runtime.model.static_rows)."""

    model: PagedModel

    def run(self, rows: list[SequenceRows], inputs: dict, state_rows: list[list[int]] | None) -> dict:
        cut = parts(rows)
        if len(cut) == 1:
            return self._part(rows, inputs, cut[0][1])
        offsets = [0, *accumulate(r.num_rows for r in rows)]
        calls = []
        for part, static in cut:
            local, held = part_inputs(inputs, offsets, rows, part)
            outputs = self._part([rows[i] for i in part], local, static)
            # copies: the next part may run in the same copy, whose output tensors these views read
            calls.append((held, {name: np.array(value) for name, value in outputs.items()}))
        return merge(calls, inputs, offsets[-1])

    def _part(self, rows: list[SequenceRows], inputs: dict, static: bool) -> dict[str, np.ndarray]:
        """One call in the copy for its row count (padded up to it), or in the dynamic model."""
        m = self.model
        if not static:
            return m.infer(rows, inputs, None, m.request, m.binder, 0)
        real = sum(r.num_rows for r in rows)
        size = copy_size(real)
        request, binder = m.static.copy(size)
        named = index_count(inputs)
        padded = index_size(named, size)
        if padded != named:
            inputs = pad_index(inputs, padded)
        start = time.perf_counter()
        outputs = m.infer(rows, inputs, None, request, binder, size - real)
        m.static.first_call(size, time.perf_counter() - start)
        if padded != named:  # outputs of the rows named more than once, cut off
            outputs = {name: value if name in ROW_OUTPUTS else value[:named] for name, value in outputs.items()}
        return outputs

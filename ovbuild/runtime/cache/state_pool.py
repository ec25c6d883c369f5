"""Per-sequence recurrent state of a hybrid target's linear-attention layers, pooled like the KV cache's blocks.

A linear-attention layer (Gated DeltaNet) carries two states per sequence from one call to the next: the causal
conv's last kernel-1 inputs and the delta rule's [heads, k_dim, v_dim] matrix. Unlike a KV cache they cannot be
rolled back by a shorter `past_lens`, so the graph reports the state after every row the caller names
(`state_rows`) and the pool keeps, per sequence, the one after the last row that stays (`keep`): after a prefill
chunk its last row, after verifying [anchor, d1..dk] with j drafts accepted the row of d_j (row j). The state
before a call is untouched until `keep`, so a rejected row never reaches the pool.

Why reported states rather than re-running the accepted rows: re-running costs a second target call per step
(a decode-sized call, the dearest part of a step on CPU), reporting costs Q states of memory traffic in the one
call (Q = rows verified), which at decode-sized k is small beside the layer weights the call reads anyway.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import openvino as ov

from ovbuild.errors import CacheExhaustedError, UnsupportedError
from ovbuild.ir.ports import STATE_OUTPUT_OF, STATE_ROWS, STATES
from ovbuild.runtime.cache.rows import SequenceRows


@dataclass(frozen=True)
class StateSpec:
    """One state input of the graph: its name, the output reporting it, and one sequence's shape."""

    name: str  # conv_state.N / recurrent_state.N
    output: str  # conv_state_out.N / recurrent_state_out.N
    shape: tuple[int, ...]  # [conv_dim, kernel - 1] / [heads, k_dim, v_dim]


def state_specs(compiled: ov.CompiledModel | ov.Model) -> list[StateSpec]:
    """The state inputs of a compiled model, shaped from its ports ([] for a model without states)."""
    outputs = {name for port in compiled.outputs for name in port.get_names()}
    specs = []
    for port in compiled.inputs:
        name = port.get_any_name()
        state = next((s for s in STATES if s.matches(name)), None)
        if state is None:
            continue
        output = STATE_OUTPUT_OF[state].of(name[len(state) :])
        dims = list(port.get_partial_shape())[1:]
        if output not in outputs or not all(d.is_static for d in dims):
            raise UnsupportedError(f"state input '{name}': needs static per-sequence dims and an output '{output}'")
        specs.append(StateSpec(name, output, tuple(d.get_length() for d in dims)))
    return specs


class StatePool:
    """Preallocated f32 state arrays [slots + 1, ...] per state input (the extra slot stays zero: a new sequence's
    state); one slot per live sequence, allocated at admission and freed with its KV blocks."""

    def __init__(self, specs: list[StateSpec], num_slots: int):
        self.specs, self.num_slots = specs, num_slots
        self.arrays = {s.name: np.zeros((num_slots + 1, *s.shape), np.float32) for s in specs}
        self._free = list(range(num_slots - 1, -1, -1))
        self.slots: dict[int, int] = {}  # seq_id -> slot
        self._reported: dict[int, dict[int, int]] = {}  # seq_id -> {row within its rows of the last call: q}
        self._outputs: dict[str, np.ndarray] = {}  # the last call's reported states, [Q, ...] per output

    @staticmethod
    def slot_bytes(specs: list[StateSpec]) -> int:
        """Bytes one sequence's states take across all layers."""
        return sum(4 * int(np.prod(s.shape)) for s in specs)

    @property
    def free_slots(self) -> int:
        return len(self._free)

    def has(self, seq_id: int) -> bool:
        return seq_id in self.slots

    def allocate(self, seq_id: int) -> None:
        """Give `seq_id` a slot (no-op if it has one); raises CacheExhaustedError (changing nothing) if none is free."""
        if seq_id in self.slots:
            return
        if not self._free:
            raise CacheExhaustedError(f"sequence {seq_id} needs a state slot, all {self.num_slots} are taken")
        self.slots[seq_id] = self._free.pop()

    def free(self, seq_id: int) -> None:
        """Return `seq_id`'s slot to the pool (no-op if it has none)."""
        slot = self.slots.pop(seq_id, None)
        if slot is not None:
            self._free.append(slot)
        self._reported.pop(seq_id, None)

    def inputs(self, rows: list[SequenceRows], keep_rows: list[list[int]] | None) -> dict[str, np.ndarray]:
        """State inputs of one packed call: each sequence's state before its first new row (zeros when it starts
        at position 0), and `state_rows`, the packed rows after which the graph reports states; keep_rows[s]: rows
        of sequence s (0-based within its rows) that may be kept (None: the last row of each sequence)."""
        index = np.empty(len(rows), np.int64)
        for s, r in enumerate(rows):
            if r.past_len == 0:
                index[s] = self.num_slots  # the zero slot
            elif r.seq_id in self.slots:
                index[s] = self.slots[r.seq_id]
            else:
                raise CacheExhaustedError(f"sequence {r.seq_id} continues at {r.past_len} but has no state slot")
        inputs = {name: np.take(array, index, axis=0) for name, array in self.arrays.items()}  # [S, ...]
        if keep_rows is None:
            keep_rows = [[r.num_rows - 1] for r in rows]
        packed, self._reported, begin = [], {}, 0
        for r, wanted in zip(rows, keep_rows, strict=True):
            reported = self._reported.setdefault(r.seq_id, {})
            for row in wanted:
                if not 0 <= row < r.num_rows:
                    raise IndexError(f"sequence {r.seq_id}: state of row {row} asked, the call runs {r.num_rows}")
                reported[row] = len(packed)
                packed.append(begin + row)
            begin += r.num_rows
        inputs[STATE_ROWS] = np.array(packed, np.int64)  # [Q]
        self._outputs = {}
        return inputs

    def report(self, outputs: dict[str, np.ndarray]) -> None:
        """Take the call's reported states ([Q, ...] per state output); they stay valid until the next call."""
        self._outputs = {s.name: outputs[s.output] for s in self.specs}

    def reported(self, seq_id: int, row: int) -> bool:
        """Whether the last call reported the state after `row` of the sequence's rows."""
        return row in self._reported.get(seq_id, {})

    def snapshot(self, seq_id: int, row: int) -> dict[str, np.ndarray]:
        """A copy of the state the last call reported after `row` of the sequence's rows (prefix caching)."""
        q = self._reported[seq_id][row]
        return {name: self._outputs[name][q].copy() for name in self.arrays}

    def restore(self, seq_id: int, snapshot: dict[str, np.ndarray]) -> None:
        """Make `snapshot` the state of `seq_id` (which holds a slot)."""
        slot = self.slots[seq_id]
        for name, array in self.arrays.items():
            array[slot] = snapshot[name]

    def keep(self, seq_id: int, row: int) -> None:
        """Commit the state after `row` (within the sequence's rows of the last call) as the sequence's state."""
        q = self._reported.get(seq_id, {}).get(row)
        if q is None:
            raise KeyError(f"sequence {seq_id}: the last call reported no state after its row {row}")
        slot = self.slots[seq_id]
        for name, array in self.arrays.items():
            array[slot] = self._outputs[name][q]

"""Binding a call's arrays to an infer request's inputs, at the least host cost per call."""

from __future__ import annotations

import numpy as np
import openvino as ov

# Arrays up to this size are copied into buffers the binder keeps bound between calls; larger ones (a hybrid
# target's states) are bound over their own memory, as a copy would cost more than the bind it saves.
REUSE_BYTES = 1 << 16
_NOTHING = object()  # no plain value is known to be in a held buffer


class InputBinder:
    """Sets arrays as an infer request's inputs by input index. A small input whose shape is the previous call's
    is written into the buffer already bound to it: no tensor is made and nothing is set (a decode step's inputs
    keep their shapes from call to call; bench_lean_calls.py, docs/speed.md measures it).

    An input may also be a plain list of numbers or a number: it is written straight into the bound buffer (no array
    is made on the way), and not at all when it equals the previous call's (a decode step's block table, its
    subsequence and logits rows). Host work right after a model call runs on cold caches, where each small numpy
    call costs several microseconds."""

    def __init__(self, request: ov.InferRequest, inputs: list[ov.Output], skip: set[str] = frozenset()):
        """inputs: the compiled model's inputs; `skip`: names bound elsewhere (the KV cache)."""
        self.request = request
        self.index: dict[str, int] = {}
        self.dtypes: dict[int, np.dtype] = {}
        for i, port in enumerate(inputs):
            name = port.get_any_name()
            if port.get_element_type().is_static() and name not in skip:
                self.index[name], self.dtypes[i] = i, port.get_element_type().to_dtype()
        self._held: dict[int, np.ndarray] = {}  # the buffer bound to each input, when the binder owns it
        self._written: dict[int, list | int | float] = {}  # the plain values a held buffer holds, when given so
        self._bound: dict[int, np.ndarray] = {}  # large arrays bound in place, kept until the input is bound again

    def bind(self, feeds: dict[str, np.ndarray | list | int | float]) -> None:
        """Bind each array (or list, or number) to the input of its name. Small arrays are copied: the caller may
        change them once this returns; a large one must stay as it is until the call returns."""
        for name, value in feeds.items():
            i = self.index.get(name)
            if i is None:  # not an input of the model: OpenVINO names it in its error
                self.request.set_tensor(name, ov.Tensor(np.ascontiguousarray(value), shared_memory=True))
                continue
            held = self._held.get(i)
            plain = type(value) in (list, int, float)
            if plain and held is not None and self._written.get(i, _NOTHING) == value:
                continue  # the bound buffer holds these very values
            shape = ((len(value),) if type(value) is list else ()) if plain else np.shape(value)
            if held is not None and held.shape == shape:
                held[...] = value  # the bound tensor reads this memory at infer()
                self._remember(i, value, plain)
                continue
            given = np.asarray(value)
            small = given.size * self.dtypes[i].itemsize <= REUSE_BYTES
            # a small array is copied (the caller's array may change after the call); a large one is bound in place
            array = np.array(given, self.dtypes[i], order="C") if small else np.require(given, self.dtypes[i], "C")
            self.request.set_input_tensor(i, ov.Tensor(array, shared_memory=True))  # 0-d stays 0-d
            if small:
                self._held[i] = array
            else:
                self._held.pop(i, None)
                # the tensor reads this memory at infer(): an array made here from a list (a long block table) must
                # outlive bind(), or the call reads freed memory (it crashed past 16,384 block indices)
                self._bound[i] = array
            self._remember(i, value, plain and small)

    def _remember(self, i: int, value, plain: bool) -> None:
        """Note the plain values now in input i's held buffer (a copy: callers may reuse their lists)."""
        if plain:
            self._written[i] = list(value) if type(value) is list else value
        else:
            self._written.pop(i, None)

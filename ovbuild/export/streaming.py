"""Streaming reads for a build: one tensor at a time, its mapped pages kept out of the resident set.

The builders read a tensor and turn it into a Constant (sharing the mapped file when the stored precision is kept,
else a converted or quantized copy) before they read the next, so a tensor's pages are never needed again once the
next one is read. While a tensor is being converted, its pages are also dropped every few milliseconds: a
conversion reads them once, front to back, so the pages already read are dead weight, and without this the largest
tensor (an embedding table) would sit in memory whole next to its converted copy. Dropping a page of a file mapping
is always safe: if it is still read, it is faulted in again from the page cache.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable

from ovbuild.weights.checkpoint import Checkpoint
from ovbuild.weights.tensor import WeightTensor
from ovbuild.weights.tensor_names import WeightSource

_LAYER = re.compile(r"^layers\.(\d+)\.")
DROP_EVERY = 0.02  # seconds: at ~1 GB/s of conversion, ~20 MB of a tensor's pages are resident at a time


class PageDropper:
    """Drops the pages of the tensor being read, when the next one is read and periodically meanwhile."""

    def __init__(self, period: float = DROP_EVERY):
        self.period = period
        self._current: tuple[Checkpoint, str] | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ovbuild-page-dropper", daemon=True)

    def __enter__(self) -> PageDropper:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.watch(None)

    def watch(self, current: tuple[Checkpoint, str] | None) -> None:
        """Drop the pages of the tensor watched so far, then watch `current` (checkpoint, tensor name)."""
        with self._lock:
            self._drop()
            self._current = current

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            with self._lock:
                self._drop()

    def _drop(self) -> None:
        if self._current is not None:
            checkpoint, name = self._current
            checkpoint.release(name)


class StreamingSource(WeightSource):
    """A WeightSource that reports each canonical name it reads and has `dropper` keep its pages out of memory."""

    def __init__(self, inner: WeightSource, dropper: PageDropper, on_read: Callable[[str], None] = lambda name: None):
        super().__init__(inner.checkpoint, inner.table)
        self.dropper, self.on_read = dropper, on_read

    def get(self, canonical: str, shape: tuple[int, ...] | None = None) -> WeightTensor:
        self.on_read(canonical)
        tensor = super().get(canonical, shape)
        self.dropper.watch((self.checkpoint, self.checkpoint_name(canonical)))
        return tensor


def layer_of(canonical: str) -> int | None:
    """`layers.3.mlp.up_proj` -> 3; None for tensors outside the layer stack."""
    m = _LAYER.match(canonical)
    return int(m.group(1)) if m else None

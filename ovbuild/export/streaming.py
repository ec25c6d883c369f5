"""Streaming reads for a build: one tensor at a time, its pages dropped once the builder has moved on.

The builders read a tensor and turn it into a Constant (sharing the mapped file when the stored precision is kept,
else a converted copy) before they read the next. So when the next tensor is read the previous one's mapped pages
are no longer needed: dropping them keeps file-backed pages from piling up in the resident set during the build.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from ovbuild.weights.tensor import WeightTensor
from ovbuild.weights.tensor_names import WeightSource

_LAYER = re.compile(r"^layers\.(\d+)\.")


class StreamingSource(WeightSource):
    """A WeightSource that reports each canonical name it reads and releases the previous tensor's pages."""

    def __init__(self, inner: WeightSource, on_read: Callable[[str], None] = lambda name: None):
        super().__init__(inner.checkpoint, inner.table)
        self.on_read = on_read
        self._last: str | None = None

    def get(self, canonical: str, shape: tuple[int, ...] | None = None) -> WeightTensor:
        self.release()
        self.on_read(canonical)
        tensor = super().get(canonical, shape)
        self._last = self.checkpoint_name(canonical)
        return tensor

    def release(self) -> None:
        """Drop the pages of the tensor read last (its Constant, if it shares them, re-reads them from the file)."""
        if self._last is not None:
            self.checkpoint.release(self._last)
            self._last = None


def layer_of(canonical: str) -> int | None:
    """`layers.3.mlp.up_proj` -> 3; None for tensors outside the layer stack."""
    m = _LAYER.match(canonical)
    return int(m.group(1)) if m else None

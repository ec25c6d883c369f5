"""The PagedAttentionExtension node (28 inputs in OpenVINO 2026.4) and the per-model inputs it shares."""

from __future__ import annotations

from typing import Protocol

import numpy as np
import openvino as ov
from openvino._pyopenvino.op import _PagedAttentionExtension

from ovbuild.graph.ops import Output, const, i32, named, parameter
from ovbuild.graph.packed import window_band
from ovbuild.ir import set_head_geometry
from ovbuild.ir.ports import (
    BLOCK_INDICES,
    BLOCK_INDICES_BEGINS,
    KEY_CACHE,
    MAX_CONTEXT_LEN,
    PAST_LENS,
    SUBSEQUENCE_BEGINS,
    VALUE_CACHE,
)

# The four sequence-layout inputs every paged model has, shared by all of its PagedAttention nodes.
SEQUENCE_INPUTS = (PAST_LENS, SUBSEQUENCE_BEGINS, BLOCK_INDICES, BLOCK_INDICES_BEGINS)


class AttentionBackend(Protocol):
    """How a graph attends: q [T, H * D], k/v [T, KV * D] of layer `layer` -> [T, H * D]."""

    def attend(
        self,
        q: Output,
        k: Output,
        v: Output,
        layer: int,
        *,
        num_kv_heads: int,
        head_dim: int,
        sliding_window: int = 0,
        token_type_ids: Output | None = None,
        path: str,
    ) -> Output: ...


class PagedInputs:
    """Model inputs shared by all PagedAttention nodes of one graph, and the per-layer cache inputs they add.

    bidirectional_rows: the longest run of token_type_ids = 1 the graph is fed (a draft's block), 0 = none. A
    windowed bidirectional layer whose window is shorter than that run gets the window inside the run too.
    """

    def __init__(self, bidirectional_rows: int = 0):
        self.bidirectional_rows = bidirectional_rows
        self._bands: dict[int, tuple[Output, Output]] = {}
        self.sequence = {port: parameter(port, [-1]) for port in SEQUENCE_INPUTS}
        self.max_context_len = parameter(MAX_CONTEXT_LEN, [])
        self.caches: list[ov.Node] = []
        self._empty_i32, self._empty_f32 = const([], np.int32), const([], np.float32)
        self._empty_u8 = const([], np.uint8)

    @property
    def parameters(self) -> list[ov.Node]:
        return [*self.sequence.values(), self.max_context_len, *self.caches]

    def attend(
        self,
        q: Output,
        k: Output,
        v: Output,
        layer: int,
        *,
        num_kv_heads: int,
        head_dim: int,
        sliding_window: int = 0,
        token_type_ids: Output | None = None,
        path: str,
    ) -> Output:
        """PagedAttention over packed rows: q [T, H * D], k/v [T, KV * D] -> [T, H * D].

        New rows are written to the cache at `past_lens`; each row sees the cached past and the causal prefix of its
        sequence's chunk. token_type_ids [T] i32 (1 = bidirectional run) opens each run of 1s to itself. A window
        keeps keys with |query - key| < window: PagedAttention applies it to the past and the causal prefix only, so
        a run longer than the window also gets a query-to-query band over its chunk (qq_bias, AND-ed with the rest).
        """
        # Cache layout and precision are chosen by the plugin at compile time: declare them fully dynamic.
        key_cache = parameter(KEY_CACHE, [-1, -1, -1, -1], layer)
        value_cache = parameter(VALUE_CACHE, [-1, -1, -1, -1], layer)
        self.caches += [key_cache, value_cache]
        s, e32, ef32 = self.sequence, self._empty_i32, self._empty_f32
        qq_bias, qq_bias_begins = self._empty_u8, e32
        if token_type_ids is not None and 0 < sliding_window < self.bidirectional_rows:
            qq_bias, qq_bias_begins = self._band(sliding_window)
        inputs = [
            q, k, v, key_cache.output(0), value_cache.output(0),
            s[PAST_LENS].output(0), s[SUBSEQUENCE_BEGINS].output(0), s[BLOCK_INDICES].output(0),
            s[BLOCK_INDICES_BEGINS].output(0),
            const(1.0 / np.sqrt(head_dim)),  # 9 scale
            i32(sliding_window),  # 10 sliding_window, 0 = off
            ef32,  # 11 alibi_slopes
            self.max_context_len.output(0),  # 12
            e32,  # 13 score_aggregation_window: must be empty, a scalar 0 fails with several sequences
            e32, e32, ef32,  # 14-16 cache rotation (off)
            ef32, i32(64), i32(8),  # 17-19 xattention threshold / block size / stride (off)
            ef32,  # 20 sinks (off)
            i32(0), e32, e32, e32,  # 21-24 adaptive R-KV (off)
            token_type_ids if token_type_ids is not None else e32,  # 25
            qq_bias, qq_bias_begins,  # 26-27 query-to-query mask (off unless the window is shorter than a run)
        ]  # fmt: skip
        pa = _PagedAttentionExtension(inputs)
        set_head_geometry(pa, num_kv_heads, head_dim)
        return named(pa, path)

    def _band(self, window: int) -> tuple[Output, Output]:
        """The |i - j| < window band of every sequence's new rows, built once per window and shared by its layers."""
        if window not in self._bands:
            begins = self.sequence[SUBSEQUENCE_BEGINS].output(0)
            self._bands[window] = window_band(begins, window, f"attention_window_band/w{window}")
        return self._bands[window]

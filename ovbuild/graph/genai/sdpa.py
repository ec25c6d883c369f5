"""Stateful SDPA attention backend: K/V kept in ReadValue/Assign state, attention by ScaledDotProductAttention.

Per layer, the chain GenAI's SDPA->PagedAttention conversion matches (and the draft runs as is):

    ReadValue(zeros [B, KV, 0, D]) ─ Gather(beam_idx) ─┐
                                   k [B, KV, S, D] ─── Concat(axis 2) ─ Assign
                                                        └ Unsqueeze ─ Broadcast ─ Reshape [B, H, L, D] ─┐
                                            q [B, H, S, D], v (same chain), additive mask, scale ─ SDPA

Packed rows [T, n * D] (T = B * S) are reshaped to [B, n, S, D] around the SDPA, so the shared building blocks keep
working on rows. The additive mask is causal and aligned bottom-right (queries are the last S of L positions).
"""

from __future__ import annotations

import numpy as np
import openvino as ov
import openvino.opset16 as ops

from ovbuild.graph.ops import Output, const, i64, named


class StatefulSDPA:
    """AttentionBackend of the stateful form. batch_seq: [2] i64 (B, S), the packed rows being B sequences of S.

    attention_mask [B, L] (1 = key present) sizes the key axis: L = past + S. committed_rows (draft): only the first
    rows of each call are stored in the state; the remaining (speculative) rows are attended to but never stored.
    """

    def __init__(
        self,
        batch_seq: Output,
        attention_mask: Output,
        beam_idx: Output | None = None,
        committed_rows: Output | None = None,
    ):
        self.batch_seq, self.attention_mask = batch_seq, attention_mask
        self.beam_idx, self.committed_rows = beam_idx, committed_rows
        self.sinks: list[ov.Node] = []
        self._masks: dict[tuple[int, bool], Output] = {}

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
        """q [T, H * D], k/v [T, KV * D] -> [T, H * D] over the stored past plus these rows."""
        num_heads = q.get_partial_shape()[1].get_length() // head_dim
        keys = self._grouped(self._cached(self._split_heads(k, num_kv_heads, head_dim), f"{path}/key"), num_heads)
        values = self._grouped(self._cached(self._split_heads(v, num_kv_heads, head_dim), f"{path}/value"), num_heads)
        mask = self._mask(sliding_window, token_type_ids)
        scale = const(1.0 / np.sqrt(head_dim))
        out = named(
            ops.scaled_dot_product_attention(
                self._split_heads(q, num_heads, head_dim), keys, values, mask, scale, causal=False
            ),
            f"{path}/sdpa",
        )  # [B, H, S, D]
        out = ops.transpose(out, i64([0, 2, 1, 3]))  # [B, S, H, D]
        return named(ops.reshape(out, i64([-1, num_heads * head_dim]), False), path)  # [T, H * D]

    def _split_heads(self, x: Output, n: int, head_dim: int) -> Output:
        """[T, n * D] -> [B, n, S, D]."""
        shape = ops.concat([self.batch_seq, i64([n, head_dim])], 0)
        x = ops.reshape(x, shape, False)  # [B, S, n, D]
        return ops.transpose(x, i64([0, 2, 1, 3])).output(0)  # [B, n, S, D]

    def _cached(self, current: Output, path: str) -> Output:
        """Past keys (or values) from the state, in beam order, followed by `current` [B, KV, S, D]."""
        kv, d = (current.get_partial_shape()[i].get_length() for i in (1, 3))
        info = ov.op.util.VariableInfo()
        info.data_shape, info.data_type, info.variable_id = ov.PartialShape([-1, kv, -1, d]), ov.Type.f32, path
        variable = ov.op.util.Variable(info)
        batch = ops.gather(self.batch_seq, i64([0]), i64(0))
        empty = ops.broadcast(const(0.0), ops.concat([batch, i64([kv, 0, d])], 0))  # [B, KV, 0, D]
        past = named(ops.read_value(empty, variable), f"{path}/past")
        if self.beam_idx is not None:
            past = named(ops.gather(past, self.beam_idx, i64(0)), f"{path}/past/beam")
        if self.committed_rows is None:
            stored = named(ops.concat([past, current], 2), f"{path}/present")  # [B, KV, past + S, D]
            self.sinks.append(ops.assign(stored.get_node(), variable))
            return stored
        lengths = ops.concat([self.committed_rows, i64([-1])], 0)
        committed, speculative = ops.variadic_split(current, i64(2), lengths).outputs()
        stored = named(ops.concat([past, committed], 2), f"{path}/present")  # [B, KV, past + committed, D]
        self.sinks.append(ops.assign(stored.get_node(), variable))
        return named(ops.concat([stored, speculative], 2), f"{path}/with_block")  # [B, KV, past + S, D]

    def _grouped(self, x: Output, num_heads: int) -> Output:
        """GQA as Unsqueeze/Broadcast/Reshape: [B, KV, L, D] -> [B, H, L, D] (the form the PA conversion reads)."""
        kv, d = (x.get_partial_shape()[i].get_length() for i in (1, 3))
        if kv == num_heads:
            return x
        x = ops.unsqueeze(x, i64([2]))  # [B, KV, 1, L, D]
        shape = ops.shape_of(x)
        target = ops.concat(
            [ops.gather(shape, i64([0, 1]), i64(0)), i64([num_heads // kv]), ops.gather(shape, i64([3, 4]), i64(0))], 0
        )
        x = ops.broadcast(x, target)  # [B, KV, H / KV, L, D]
        return ops.reshape(x, i64([0, num_heads, -1, d]), True).output(0)  # [B, H, L, D]

    def _mask(self, window: int, token_type_ids: Output | None) -> Output:
        """Additive mask [B, 1, S, L]: causal, opened inside the block (token_type_ids = 1), windowed, key padding."""
        key = (window, token_type_ids is not None)
        if key in self._masks:
            return self._masks[key]
        length = ops.gather(ops.shape_of(self.attention_mask), i64(1), i64(0))  # L
        seq = ops.gather(self.batch_seq, i64(1), i64(0))  # S
        key_pos = ops.range(i64(0), length, i64(1), ov.Type.i64)  # [L]
        query_pos = ops.unsqueeze(ops.range(ops.subtract(length, seq), length, i64(1), ov.Type.i64), i64([1]))  # [S, 1]
        visible = ops.less_equal(key_pos, query_pos)  # [S, L]
        if token_type_ids is not None:
            # One bidirectional run per call (the draft's block): its rows see each other. Batch 1.
            block_query = ops.unsqueeze(ops.equal(token_type_ids, const(1, np.int32)), i64([1]))  # [S, 1]
            padded = ops.pad(token_type_ids, ops.unsqueeze(ops.subtract(length, seq), i64([0])), i64([0]), "constant")
            block_key = ops.equal(padded, const(1, np.int32))  # [L]
            visible = ops.logical_or(visible, ops.logical_and(block_query, block_key))
        if window:
            distance = ops.subtract(query_pos, key_pos)  # [S, L]
            inside = ops.logical_and(ops.less(distance, i64(window)), ops.less(ops.negative(distance), i64(window)))
            visible = ops.logical_and(visible, inside)
        present = ops.unsqueeze(ops.not_equal(self.attention_mask, i64(0)), i64([1, 2]))  # [B, 1, 1, L]
        visible = ops.logical_and(present, visible)  # [B, 1, S, L]
        kind = "block" if token_type_ids is not None else "causal"
        name = f"attention_mask/{kind}_w{window}" if window else f"attention_mask/{kind}"
        mask = named(ops.select(visible, const(0.0), const(-np.inf)), name)
        self._masks[key] = mask
        return mask

"""Paged KV cache: the key/value cache tensors of one compiled model and a block allocator over them."""

from __future__ import annotations

from itertools import accumulate
from typing import NamedTuple

import numpy as np
import openvino as ov

from ovbuild.errors import CacheExhaustedError
from ovbuild.ir.ports import (
    BLOCK_INDICES,
    BLOCK_INDICES_BEGINS,
    CACHES,
    MAX_CONTEXT_LEN,
    PAST_LENS,
    SUBSEQUENCE_BEGINS,
    VALUE_CACHE,
)
from ovbuild.runtime.cache_manager import CacheManager


class SequenceRows(NamedTuple):
    """One sequence's part of a packed call: its id, tokens already cached, and rows written by this call (a tuple:
    the scheduler makes one per request per call, and a frozen dataclass took 3x as long to make)."""

    seq_id: int
    past_len: int
    num_rows: int


def sequence_rows(seq_id: int, past_len: int, num_rows: int, one_per_row: bool) -> list[SequenceRows]:
    """A sequence's rows of a call: one subsequence, or (one_per_row) a 1-row subsequence per row, each attending to
    the rows before it (how verification rows run on CPU: see PagedModel.row_subsequences)."""
    if one_per_row:
        return [SequenceRows(seq_id, past_len + i, 1) for i in range(num_rows)]
    return [SequenceRows(seq_id, past_len, num_rows)]


class BlockAllocator(CacheManager):
    """Fixed pool of KV cache blocks; each sequence owns a list of blocks in logical order."""

    def __init__(self, num_blocks: int, block_size: int, pinned: dict[int, list[int]] | None = None):
        """pinned: tables held for good by blocks outside the pool (ids from num_blocks on), e.g. padding rows'."""
        self.num_blocks, self.block_size = num_blocks, block_size
        self._free = list(range(num_blocks - 1, -1, -1))
        self.tables: dict[int, list[int]] = {}
        self.pinned = pinned or {}
        self.borrowed: dict[int, int] = {}  # sequence -> leading blocks of its table that another sequence owns

    @property
    def free_blocks(self) -> int:
        return len(self._free)

    def blocks_needed(self, seq_id: int, length: int) -> int:
        """Blocks still to allocate for `seq_id` to hold `length` tokens."""
        return max(0, self.blocks_for(length) - len(self.tables.get(seq_id, ())))

    def can_hold(self, seq_id: int, length: int) -> bool:
        return self.blocks_needed(seq_id, length) <= self.free_blocks

    def reserve(self, seq_id: int, length: int) -> list[int]:
        """Grow `seq_id`'s table to hold `length` tokens and return it; raises CacheExhaustedError (changing nothing)
        if it can't."""
        if seq_id in self.pinned:
            return self.pinned[seq_id]  # sized for the longest it is used for by whoever pinned it
        table = self.tables.get(seq_id, [])
        need = self.blocks_for(length) - len(table)
        if need <= 0:
            return table  # every step of a decoding sequence but one in block_size: kept cheap
        if need > len(self._free):
            raise CacheExhaustedError(
                f"sequence {seq_id} needs {need} more cache blocks for {length} tokens, "
                f"{self.free_blocks} of {self.num_blocks} are free"
            )
        table.extend(self._free.pop() for _ in range(need))
        self.tables[seq_id] = table
        return table

    def fork(self, seq_id: int, source: int, shared: int, length: int) -> tuple[int, int] | None:
        """A table for `seq_id` holding `length` tokens whose first `shared` tokens are `source`'s: the whole blocks
        among them are borrowed from `source` (read, never written), every other block is fresh. Returns (source
        block, fresh block) when `shared` ends inside a block, whose tokens the caller must copy; raises
        CacheExhaustedError (changing nothing) when too few blocks are free."""
        whole = shared // self.block_size
        need = self.blocks_for(length) - whole
        if need > len(self._free):
            raise CacheExhaustedError(
                f"sequence {seq_id} needs {need} more cache blocks for {length} tokens, "
                f"{self.free_blocks} of {self.num_blocks} are free"
            )
        source_table = self.tables[source]
        self.tables[seq_id] = source_table[:whole] + [self._free.pop() for _ in range(need)]
        self.borrowed[seq_id] = whole
        return (source_table[whole], self.tables[seq_id][whole]) if shared % self.block_size else None

    def free(self, seq_id: int) -> None:
        """Return every block of `seq_id` to the pool (but those it borrowed: see `fork`)."""
        table = self.tables.pop(seq_id, [])
        self._free.extend(reversed(table[self.borrowed.pop(seq_id, 0) :]))


def cache_block_size(compiled: ov.CompiledModel) -> int:
    """Tokens per cache block, as the compiled model lays its caches out."""
    for port in compiled.inputs:
        if port.get_any_name().startswith(VALUE_CACHE):
            # value layout [blocks, kv_heads, block_size, head_dim (+ quant params)]
            return port.get_partial_shape()[2].get_length()
    return 32


class PagedKVCache:
    """Cache tensors shaped from the compiled model's inputs, bound to one infer request, plus their allocator."""

    def __init__(
        self,
        compiled: ov.CompiledModel,
        request: ov.InferRequest,
        num_blocks: int,
        pinned: tuple[int, int] | None = None,
    ):
        """pinned: (sequence id, rows) given blocks of their own beyond the num_blocks of the pool."""
        block_size = cache_block_size(compiled)
        pinned_id, pinned_rows = pinned or (0, 0)
        extra = -(-pinned_rows // block_size)
        self.names: list[str] = []
        self.tensors: dict[str, ov.Tensor] = {}
        for port in compiled.inputs:
            name = port.get_any_name()
            if not name.startswith(CACHES):
                continue
            dims = [d.get_length() for d in list(port.get_partial_shape())[1:]]
            self.tensors[name] = ov.Tensor(port.get_element_type(), [num_blocks + extra, *dims])
            request.set_tensor(name, self.tensors[name])
            self.names.append(name)
        held = {pinned_id: list(range(num_blocks, num_blocks + extra))} if extra else {}
        self.allocator = BlockAllocator(num_blocks, block_size, held)

    @property
    def block_size(self) -> int:
        return self.allocator.block_size

    def copy_block(self, source: int, target: int) -> None:
        """Copy one block's keys and values in every layer (bytes as stored: any cache precision)."""
        for tensor in self.tensors.values():
            data = tensor.data.view(np.uint8)  # [blocks, ..., bytes]: bits as stored, whatever the precision
            data[target] = data[source]

    def layout(self, rows: list[SequenceRows]) -> dict[str, list[int] | int]:
        """PagedAttention inputs for one packed call, as plain lists (the binder writes them into the request's
        buffers), reserving blocks for every row it writes."""
        # Plain lists, never arrays: numpy's per-call overhead outweighs its speed at these sizes.
        size, reserve = self.block_size, self.allocator.reserve
        ends = [r.past_len + r.num_rows for r in rows]
        counts = [-(-end // size) for end in ends]  # blocks holding each sequence's rows 0..end-1
        blocks = [b for r, end, n in zip(rows, ends, counts, strict=True) for b in reserve(r.seq_id, end)[:n]]
        return {
            PAST_LENS: [r.past_len for r in rows],
            SUBSEQUENCE_BEGINS: [0, *accumulate([r.num_rows for r in rows])],
            BLOCK_INDICES: blocks,
            BLOCK_INDICES_BEGINS: [0, *accumulate(counts)],
            MAX_CONTEXT_LEN: max(ends, default=0),
        }

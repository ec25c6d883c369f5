"""Paged KV cache: the key/value cache tensors of one compiled model and a block allocator over them."""

from __future__ import annotations

from collections import OrderedDict
from itertools import accumulate

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
from ovbuild.runtime.cache.cache_manager import CacheManager
from ovbuild.runtime.cache.rows import SequenceRows, sequence_rows

__all__ = ["BlockAllocator", "PagedKVCache", "SequenceRows", "cache_block_size", "context_bound", "sequence_rows"]

# The CPU plugin's PagedAttention sizes a score buffer by max_context_len and, whenever the buffer must grow (every 32
# tokens of a longer context), compiles its attention kernels again, in every layer of every compiled model: 4 to 15
# ms a time on the demo draft, whose calls take 0.6 to 1.2 ms, so that a run's first draft calls cost 5x their later
# ones and the planner priced drafting from them. The kernel reads each sequence's own length from past_lens; the
# bound is only the buffer's size. Rounded up to a power of two, at least MIN_CONTEXT_BOUND, it grows a handful of
# times per run, and the buffer is at most twice what the longest sequence needs.
MIN_CONTEXT_BOUND = 256


def context_bound(longest: int) -> int:
    """The max_context_len passed for a call whose longest sequence spans `longest` tokens (0 for none)."""
    return max(MIN_CONTEXT_BOUND, 1 << (longest - 1).bit_length()) if longest > 0 else 0


class BlockAllocator(CacheManager):
    """Fixed pool of KV cache blocks; each sequence holds a table of blocks in logical order.

    Blocks are reference counted: a full block of committed tokens can be registered under its chained hash
    (ovbuild.runtime.cache.prefix) and shared by every sequence whose prefix hashes the same. A block nobody holds goes
    back to the free queue; a registered one keeps its contents and its hash there, and is reused by a later hit until
    its room is needed: blocks are taken from the front of the queue, unregistered ones (nothing lost) are put there,
    and registered ones at the back (least recently freed go first)."""

    def __init__(self, num_blocks: int, block_size: int, pinned: dict[int, list[int]] | None = None):
        """pinned: tables held for good by blocks outside the pool (ids from num_blocks on), e.g. padding rows'."""
        self.num_blocks, self.block_size = num_blocks, block_size
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))  # front = taken next
        self.refs = [0] * num_blocks
        self.tables: dict[int, list[int]] = {}
        self.pinned = pinned or {}
        self.cached: dict[bytes, int] = {}  # block hash -> block
        self.block_hash: dict[int, bytes] = {}  # block -> its hash, for the registered blocks
        self.evictions = 0

    @property
    def free_blocks(self) -> int:
        return len(self._free)

    @property
    def used_blocks(self) -> int:
        """Blocks some sequence holds."""
        return self.num_blocks - len(self._free)

    def blocks_needed(self, seq_id: int, length: int) -> int:
        """Blocks still to allocate for `seq_id` to hold `length` tokens."""
        return max(0, self.blocks_for(length) - len(self.tables.get(seq_id, ())))

    def can_hold(self, seq_id: int, length: int) -> bool:
        return self.blocks_needed(seq_id, length) <= self.free_blocks

    def holds(self, seq_id: int, length: int) -> bool:
        table = self.tables.get(seq_id)
        return seq_id in self.pinned or (table is not None and length <= len(table) * self.block_size)

    def _take(self) -> int:
        """The block at the front of the free queue, its registration dropped (its contents are about to change)."""
        block, _ = self._free.popitem(last=False)
        digest = self.block_hash.pop(block, None)
        if digest is not None:
            del self.cached[digest]
            self.evictions += 1
        self.refs[block] = 1
        return block

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
        table.extend(self._take() for _ in range(need))
        self.tables[seq_id] = table
        return table

    def lookup(self, hashes: list[bytes]) -> list[int]:
        """The registered blocks of the longest run of `hashes` from the first."""
        blocks = []
        for digest in hashes:
            block = self.cached.get(digest)
            if block is None:
                break
            blocks.append(block)
        return blocks

    def share(self, seq_id: int, blocks: list[int]) -> None:
        """Start `seq_id`'s (empty) table with `blocks`, registered blocks it reads and never writes."""
        if self.tables.get(seq_id):
            raise ValueError(f"sequence {seq_id} holds blocks already: shared blocks start a table")
        for block in blocks:
            if self.refs[block] == 0:
                del self._free[block]
            self.refs[block] += 1
        self.tables[seq_id] = list(blocks)

    def register(self, seq_id: int, hashes: list[bytes]) -> None:
        """Register the first len(hashes) blocks of `seq_id`'s table (full of committed tokens) under `hashes`. A
        block whose hash is registered already (the same prefix computed twice at once) stays unregistered."""
        table = self.tables.get(seq_id, [])
        for block, digest in zip(table, hashes, strict=False):
            if block not in self.block_hash and digest not in self.cached:
                self.cached[digest] = block
                self.block_hash[block] = digest

    def fork(self, seq_id: int, source: int, shared: int, length: int) -> tuple[int, int] | None:
        """A table for `seq_id` holding `length` tokens whose first `shared` tokens are `source`'s: the whole blocks
        among them are shared with `source` (read, never written), every other block is fresh. Returns (source
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
        self.share(seq_id, source_table[:whole])
        self.tables[seq_id] += [self._take() for _ in range(need)]
        return (source_table[whole], self.tables[seq_id][whole]) if shared % self.block_size else None

    def free(self, seq_id: int) -> None:
        """Drop `seq_id`'s hold on every block of its table; a block nobody holds any more goes back to the queue,
        a registered one (still reusable by a hit) at the back, another at the front."""
        for block in reversed(self.tables.pop(seq_id, [])):  # its last blocks leave the cache first
            self.refs[block] -= 1
            if self.refs[block] == 0:
                self._free[block] = None
                if block not in self.block_hash:
                    self._free.move_to_end(block, last=False)

    def check(self) -> None:
        """Raise AssertionError unless every count agrees: references with the tables, the free queue with the
        blocks nobody holds, registrations both ways (a test's invariant)."""
        held = [0] * self.num_blocks
        for seq_id, table in self.tables.items():
            for block in table:
                held[block] += 1
            assert len(set(table)) == len(table), f"sequence {seq_id} holds a block twice"
        assert held == self.refs, "reference counts disagree with the tables"
        assert set(self._free) == {b for b in range(self.num_blocks) if held[b] == 0}, "free queue disagrees"
        assert {b: d for d, b in self.cached.items()} == self.block_hash, "registrations disagree"


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
            MAX_CONTEXT_LEN: context_bound(max(ends, default=0)),
        }

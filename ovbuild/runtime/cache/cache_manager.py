"""CacheManager: what the scheduler asks of a model's cache, the target's and the draft's alike.

A sequence takes blocks as it grows (`reserve`, before each call that writes past its blocks) and gives them back
with `free`. What a call leaves behind becomes the sequence's only through `commit`: committed tokens' full blocks are
registered for prefix caching (ovbuild.runtime.cache.prefix), and a hybrid target keeps the linear-attention state after
the last committed row. Rows a call wrote past the committed length (rejected draft tokens) are never committed: the
next call overwrites them. `cached_prefix` and `resume` start a new sequence on the longest prefix the cache holds.
A model whose cache is more than KV blocks (recurrent state slots) gives the scheduler the same calls.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import OrderedDict

import numpy as np

from ovbuild.errors import ConfigError
from ovbuild.runtime.cache.state_pool import StatePool


class CacheManager(ABC):
    """Room for whole sequences in one model's cache, counted in blocks of `block_size` tokens."""

    num_blocks: int
    block_size: int

    @property
    @abstractmethod
    def free_blocks(self) -> int:
        """Blocks no sequence holds (registered ones among them are reused by a hit until their room is needed)."""

    def blocks_for(self, length: int) -> int:
        """Blocks a sequence of `length` tokens takes."""
        return -(-length // self.block_size)

    def fits(self, length: int) -> bool:
        """Whether a sequence of `length` tokens fits at all, with every block free."""
        return self.blocks_for(length) <= self.num_blocks

    @abstractmethod
    def can_hold(self, seq_id: int, length: int) -> bool:
        """Whether `seq_id` can grow to `length` tokens with the blocks free now."""

    @abstractmethod
    def holds(self, seq_id: int, length: int) -> bool:
        """Whether `seq_id` already has room for `length` tokens (reserve would take nothing)."""

    @abstractmethod
    def reserve(self, seq_id: int, length: int) -> None:
        """Grow `seq_id`'s share to `length` tokens; raises CacheExhaustedError (changing nothing) if it can't."""

    @abstractmethod
    def free(self, seq_id: int) -> None:
        """Return everything `seq_id` holds."""

    @abstractmethod
    def lookup(self, hashes: list[bytes]) -> list[int]:
        """The registered blocks of the longest run of `hashes` from the first."""

    @abstractmethod
    def share(self, seq_id: int, blocks: list[int]) -> None:
        """Start `seq_id`'s empty table with registered `blocks`."""

    @abstractmethod
    def register(self, seq_id: int, hashes: list[bytes]) -> None:
        """Register `seq_id`'s first len(hashes) blocks, full of committed tokens, under `hashes`."""

    def cached_prefix(self, hashes: list[bytes]) -> int:
        """Tokens of the longest prefix (block hashes `hashes`) a new sequence can start on."""
        return len(self.lookup(hashes)) * self.block_size

    def resume(self, seq_id: int, hashes: list[bytes], length: int) -> None:
        """Start `seq_id` on the cached first `length` tokens (a multiple of block_size, at most cached_prefix)."""
        blocks = self.lookup(hashes[: length // self.block_size])
        if len(blocks) * self.block_size != length:
            raise ValueError(f"sequence {seq_id}: {length} tokens asked, {len(blocks) * self.block_size} cached")
        self.share(seq_id, blocks)

    def commit(self, seq_id: int, start: int, length: int, hashes: list[bytes] | None) -> None:
        """`seq_id` holds `length` committed tokens, `start` of them before the last call; `hashes`: the block hashes
        of its committed tokens to register (None: prefix caching off)."""
        if hashes is not None and length // self.block_size > start // self.block_size:
            self.register(seq_id, hashes[: length // self.block_size])

    def state_rows(self, past_len: int, num_rows: int, decoding: bool) -> list[int] | None:
        """Rows of a sequence's call whose states the call reports (None: a cache without states)."""
        return None

    @property
    def usage(self) -> float:
        """Share of the blocks some sequence holds."""
        return 1.0 - self.free_blocks / self.num_blocks if self.num_blocks else 0.0


class BlocksAndSlots(CacheManager):
    """A hybrid target's cache: KV blocks for its full-attention layers and one state slot per sequence for its
    linear-attention layers (`StatePool`); a sequence is admitted only when both have room, and freed from both.

    Prefix caching needs the state at the hit's end too, and a state cannot be cut back like a KV cache: so the state
    after every `snapshot_interval` committed tokens is copied aside, keyed by the hash of the block it ends (at most
    `max_snapshots`, least recently used dropped first). A hit resumes from the last snapshot within the cached
    blocks. The interval trades memory for reuse: one snapshot costs a whole sequence's state (StatePool.slot_bytes),
    and a hit recomputes up to interval - 1 tokens past its last snapshot."""

    def __init__(self, blocks: CacheManager, states: StatePool, snapshot_interval: int = 0, max_snapshots: int = 0):
        """snapshot_interval: tokens between snapshots (a multiple of the block size; 0 = no snapshots, no hits)."""
        self.blocks, self.states = blocks, states
        self.num_blocks, self.block_size = blocks.num_blocks, blocks.block_size
        self.snapshots: OrderedDict[bytes, dict[str, np.ndarray]] = OrderedDict()  # oldest use first
        self.keep_snapshots(snapshot_interval, max_snapshots)

    def keep_snapshots(self, interval: int, count: int) -> None:
        """Snapshot the state every `interval` committed tokens (a multiple of the block size; 0 = never), keeping
        at most `count` snapshots."""
        if interval % self.block_size:
            raise ConfigError(
                f"state snapshot interval {interval} must be a multiple of the cache block size {self.block_size}"
            )
        self.snapshot_interval, self.max_snapshots = interval, count
        while len(self.snapshots) > count:
            self.snapshots.popitem(last=False)

    @property
    def free_blocks(self) -> int:
        return self.blocks.free_blocks

    def can_hold(self, seq_id: int, length: int) -> bool:
        has_slot = self.states.has(seq_id) or self.states.free_slots > 0
        return has_slot and self.blocks.can_hold(seq_id, length)

    def holds(self, seq_id: int, length: int) -> bool:
        return self.states.has(seq_id) and self.blocks.holds(seq_id, length)

    def reserve(self, seq_id: int, length: int) -> None:
        if not self.states.has(seq_id) and not self.states.free_slots:
            self.states.allocate(seq_id)  # raises CacheExhaustedError before any block is taken
        self.blocks.reserve(seq_id, length)
        self.states.allocate(seq_id)

    def free(self, seq_id: int) -> None:
        self.blocks.free(seq_id)
        self.states.free(seq_id)

    def lookup(self, hashes: list[bytes]) -> list[int]:
        return self.blocks.lookup(hashes)

    def share(self, seq_id: int, blocks: list[int]) -> None:
        self.blocks.share(seq_id, blocks)

    def register(self, seq_id: int, hashes: list[bytes]) -> None:
        self.blocks.register(seq_id, hashes)

    def cached_prefix(self, hashes: list[bytes]) -> int:
        """The last snapshot boundary within the cached blocks (0 without one)."""
        if not self.snapshot_interval:
            return 0
        per = self.snapshot_interval // self.block_size
        cached = len(self.blocks.lookup(hashes))
        for end in range(cached - cached % per, 0, -per):
            if hashes[end - 1] in self.snapshots:
                return end * self.block_size
        return 0

    def state_before(self, hashes: list[bytes], length: int) -> tuple[int, dict[str, np.ndarray] | None]:
        """(tokens, state after them): the longest prefix of at most `length` tokens (block hashes `hashes`) whose
        state a snapshot keeps; (0, None) without one: the zero state before any row (where ovbuild.runtime.catch_up
        starts)."""
        if not self.snapshot_interval:
            return 0, None
        per = self.snapshot_interval // self.block_size
        whole = min(length // self.block_size, len(hashes))
        for end in range(whole - whole % per, 0, -per):
            snapshot = self.snapshots.get(hashes[end - 1])
            if snapshot is not None:
                return end * self.block_size, snapshot
        return 0, None

    def resume(self, seq_id: int, hashes: list[bytes], length: int) -> None:
        self.states.allocate(seq_id)
        super().resume(seq_id, hashes, length)
        if length:
            digest = hashes[length // self.block_size - 1]
            self.snapshots.move_to_end(digest)
            self.states.restore(seq_id, self.snapshots[digest])

    def state_rows(self, past_len: int, num_rows: int, decoding: bool) -> list[int] | None:
        """Every row of a verification (the last accepted is kept); a prompt chunk's last row and the rows ending a
        snapshot interval."""
        if decoding:
            return list(range(num_rows))
        rows = []
        if self.snapshot_interval and self.max_snapshots:
            every = self.snapshot_interval
            first = (past_len // every + 1) * every  # the first boundary after past_len
            rows = [end - past_len - 1 for end in range(first, past_len + num_rows, every)]
        return [*rows, num_rows - 1]

    def commit(self, seq_id: int, start: int, length: int, hashes: list[bytes] | None) -> None:
        """Keep the state after the last committed row of the last call; snapshot it at interval boundaries."""
        self.states.keep(seq_id, length - start - 1)
        super().commit(seq_id, start, length, hashes)
        if hashes is None or not (self.snapshot_interval and self.max_snapshots):
            return
        every = self.snapshot_interval
        for end in range((start // every + 1) * every, length + 1, every):
            digest = hashes[end // self.block_size - 1]
            if digest in self.snapshots or not self.states.reported(seq_id, end - start - 1):
                continue
            self.snapshots[digest] = self.states.snapshot(seq_id, end - start - 1)
            while len(self.snapshots) > self.max_snapshots:
                self.snapshots.popitem(last=False)

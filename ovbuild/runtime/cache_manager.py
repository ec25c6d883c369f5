"""CacheManager: what the scheduler asks of a model's cache, the target's and the draft's alike.

Admission reserves each request's worst case in every cache up front (the budgets come from one place,
`Scheduler.budgets`), so a running request never runs out of room and nothing is ever evicted. A model whose cache is
more than KV blocks (recurrent state slots, say) gives the scheduler the same five calls.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ovbuild.runtime.state_pool import StatePool


class CacheManager(ABC):
    """Room for whole sequences in one model's cache, counted in blocks of `block_size` tokens."""

    num_blocks: int
    block_size: int

    @property
    @abstractmethod
    def free_blocks(self) -> int:
        """Blocks no sequence holds."""

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
    def reserve(self, seq_id: int, length: int) -> None:
        """Grow `seq_id`'s share to `length` tokens; raises CacheExhaustedError (changing nothing) if it can't."""

    @abstractmethod
    def free(self, seq_id: int) -> None:
        """Return everything `seq_id` holds."""


class BlocksAndSlots(CacheManager):
    """A hybrid target's cache: KV blocks for its full-attention layers and one state slot per sequence for its
    linear-attention layers (`StatePool`); a sequence is admitted only when both have room, and freed from both."""

    def __init__(self, blocks: CacheManager, states: StatePool):
        self.blocks, self.states = blocks, states
        self.num_blocks, self.block_size = blocks.num_blocks, blocks.block_size

    @property
    def free_blocks(self) -> int:
        return self.blocks.free_blocks

    def can_hold(self, seq_id: int, length: int) -> bool:
        has_slot = self.states.has(seq_id) or self.states.free_slots > 0
        return has_slot and self.blocks.can_hold(seq_id, length)

    def reserve(self, seq_id: int, length: int) -> None:
        if not self.states.has(seq_id) and not self.states.free_slots:
            self.states.allocate(seq_id)  # raises CacheExhaustedError before any block is taken
        self.blocks.reserve(seq_id, length)
        self.states.allocate(seq_id)

    def free(self, seq_id: int) -> None:
        self.blocks.free(seq_id)
        self.states.free(seq_id)

"""The block allocator: worst-case reservation, growth, exhaustion that changes nothing, and blocks coming back."""

from __future__ import annotations

import pytest

from ovbuild.errors import CacheExhaustedError
from ovbuild.runtime.kv_cache import BlockAllocator


def test_reserve_grows_tables_and_free_returns_every_block():
    a = BlockAllocator(num_blocks=8, block_size=4)
    assert a.reserve(0, 9) == [0, 1, 2]  # ceil(9 / 4) blocks, handed out from block 0 up
    assert a.reserve(1, 4) == [3]
    assert a.reserve(0, 12) == [0, 1, 2] and a.blocks_needed(0, 13) == 1  # already held: nothing new
    assert a.reserve(0, 13) == [0, 1, 2, 4]
    assert a.free_blocks == 3
    a.free(0)
    assert a.free_blocks == 7 and 0 not in a.tables
    assert sorted(a.reserve(2, 28)) == [0, 1, 2, 4, 5, 6, 7]  # every freed block is usable again
    a.free(1)
    a.free(2)
    assert a.free_blocks == 8 and a.tables == {}


def test_exhaustion_raises_and_changes_nothing():
    a = BlockAllocator(num_blocks=4, block_size=8)
    a.reserve(0, 20)
    with pytest.raises(CacheExhaustedError, match="needs 2 more cache blocks"):
        a.reserve(1, 16)
    assert a.free_blocks == 1 and 1 not in a.tables
    assert a.fits(32) and not a.fits(33) and a.can_hold(1, 8) and not a.can_hold(1, 9)

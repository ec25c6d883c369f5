"""The block allocator: worst-case reservation, growth, exhaustion that changes nothing, and blocks coming back."""

from __future__ import annotations

import pytest

from ovbuild.errors import CacheExhaustedError
from ovbuild.runtime.cache.kv_cache import BlockAllocator
from ovbuild.runtime.cache.prefix import chain_hashes


def test_reserve_grows_tables_and_free_returns_every_block():
    a = BlockAllocator(num_blocks=8, block_size=4)
    assert a.reserve(0, 9) == [0, 1, 2]  # ceil(9 / 4) blocks, handed out from block 0 up
    assert a.reserve(1, 4) == [3]
    assert a.reserve(0, 12) == [0, 1, 2] and a.blocks_needed(0, 13) == 1  # already held: nothing new
    assert a.holds(0, 12) and not a.holds(0, 13) and not a.holds(5, 1)  # room for 12 tokens in 3 blocks of 4
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


def test_registered_blocks_are_shared_by_reference_and_the_least_recently_freed_are_evicted_first():
    a = BlockAllocator(num_blocks=6, block_size=4)
    hashes = chain_hashes(list(range(12)), 4, [])
    a.reserve(0, 12)
    a.register(0, hashes)  # blocks 0, 1, 2 hold three full blocks of committed tokens
    a.reserve(1, 4)  # block 3, never registered
    a.free(1)
    a.free(0)
    a.check()
    assert a.free_blocks == 6 and a.lookup(hashes) == [0, 1, 2]  # freed, still cached
    a.share(2, a.lookup(hashes[:2]))
    a.share(3, a.lookup(hashes[:1]))
    assert a.refs[:3] == [2, 1, 0] and a.free_blocks == 4
    # unregistered blocks go first (block 3, then the never used 4 and 5), then the registered ones, the last block of
    # a freed sequence before its first: block 2 is evicted and its hash with it
    assert a.reserve(4, 16) == [3, 4, 5, 2]
    assert a.lookup(hashes) == [0, 1] and a.evictions == 1
    with pytest.raises(CacheExhaustedError):
        a.reserve(5, 4)
    for seq in (2, 3, 4):
        a.free(seq)
    a.check()
    assert a.free_blocks == 6 and a.refs == [0] * 6 and not a.tables


def test_block_hashes_chain_over_the_whole_prefix():
    ones = chain_hashes([1, 2, 3, 4, 5, 6, 7, 8], 4, [])
    other = chain_hashes([9, 2, 3, 4, 5, 6, 7, 8], 4, [])
    assert len(ones) == 2 and ones[0] != other[0] and ones[1] != other[1]  # equal second blocks, other parents
    assert chain_hashes([1, 2, 3, 4, 5, 6, 7, 8, 9], 4, ones[:1]) == ones  # extended from the known ones, equal

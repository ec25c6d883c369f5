"""Admission with prefix hits: how much of a waiting request's context every cache already holds (the block hashes:
ovbuild.runtime.cache.prefix), and whether it waits for a running request that is prefilling its first block."""

from __future__ import annotations

import math
from collections.abc import Iterable

from ovbuild.runtime.cache.cache_manager import CacheManager
from ovbuild.runtime.request import Request


def prefix_hits(request: Request, target: CacheManager, draft: CacheManager | None, stateful: bool) -> tuple[int, int]:
    """(target, draft) tokens of the request's context found cached: whole blocks, never the last context token
    (its row must run: its logits give the first token). The draft's hit is at most the target's; when it is shorter,
    the taps in between are a gap the target computes again before the request drafts (ovbuild.runtime.catch_up).
    A target with states (`stateful`) cannot run a catch-up: both start at one length, the longest every cache (and a
    snapshot) holds. draft None: the target alone."""
    limit = request.context_len - 1
    hit = target.cached_prefix(request.block_hashes(target.block_size, limit))
    if draft is None:
        return hit, 0
    hashes = request.block_hashes(draft.block_size, limit)
    if not stateful:
        draft_hit = min(draft.cached_prefix(hashes), hit)
        return hit, draft_hit - draft_hit % draft.block_size
    caches = [target, draft]
    step = math.lcm(target.block_size, draft.block_size)
    common = min(hit, draft.cached_prefix(hashes))
    common -= common % step
    while common and not all(c.cached_prefix(request.block_hashes(c.block_size, common)) == common for c in caches):
        common -= step
    return common, common


def prefilling_its_first_block(request: Request, prefilling: Iterable[Request], block_size: int) -> bool:
    """Whether one of the `prefilling` requests is computing the request's first block (n samples of one prompt,
    queued together): waiting for it lets the request start on the cached block instead of computing it again."""
    if request.context_len <= block_size:
        return False
    first = request.block_hashes(block_size, block_size)
    return any(r.context_len > block_size and r.block_hashes(block_size, block_size) == first for r in prefilling)

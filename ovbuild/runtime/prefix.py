"""Block hashes for prefix caching: a full block of committed tokens is named by a hash chained over its token ids
and its parent block's hash, so that equal hashes mean equal blocks *and* equal everything before them.

Chained hashes are what lets a cache hold blocks of many sequences without storing their tokens: a request looks its
hashes up in order and reuses the longest run found. blake2b (16 bytes) makes a collision, which would silently hand
a request another prefix's keys and values, as unlikely as a hardware fault.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from ovbuild.runtime.cache_manager import CacheManager
    from ovbuild.runtime.request import Request


def chain_hashes(
    tokens: list[int] | np.ndarray,
    block_size: int,
    parents: list[bytes],
    extra: Callable[[int, int], bytes] | None = None,
) -> list[bytes]:
    """`parents` (the hashes of the first blocks, already computed) extended over every full block of `tokens`.
    extra(block, block_size): what else block `block` holds besides its token ids (the images it shows), hashed with
    them."""
    hashes = list(parents)
    full = len(tokens) // block_size
    parent = hashes[-1] if hashes else b""
    for b in range(len(hashes), full):
        block = np.asarray(tokens[b * block_size : (b + 1) * block_size], np.int64)  # [block_size]
        more = extra(b, block_size) if extra is not None else b""
        parent = hashlib.blake2b(parent + block.tobytes() + more, digest_size=16).digest()
        hashes.append(parent)
    return hashes


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

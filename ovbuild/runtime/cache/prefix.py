"""Block hashes for prefix caching: a full block of committed tokens is named by a hash chained over its token ids
and its parent block's hash, so that equal hashes mean equal blocks *and* equal everything before them.

Chained hashes are what lets a cache hold blocks of many sequences without storing their tokens: a request looks its
hashes up in order and reuses the longest run found. blake2b (16 bytes) makes a collision, which would silently hand
a request another prefix's keys and values, as unlikely as a hardware fault.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import numpy as np


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

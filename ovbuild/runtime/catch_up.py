"""Catching up on taps: the target's taps of committed rows the draft has not seen, for a request that drafts again.

A request's draft can fall behind its target in two ways. While drafting pays for nobody, the scheduler runs the
target without its taps (PagedModel.can_skip_taps): on a small target they cost about a tenth of a call. And a request
admitted on a prefix the target's cache holds but the draft's does not (a draft that sat idle while the planner found
drafting slower never wrote those context rows) starts its draft behind: the taps of that prefix were never computed
in this request (ovbuild.runtime.admission.prefix_hits). A request that is to draft needs the taps of every token its
draft has not seen, so the target runs once more over those rows.

It must not write the request's cache: its rows would overwrite committed keys and values with ones computed in another
kernel (a prompt chunk ran as one subsequence), and the target alone's rounding is what greedy output must keep. So
each request's catch-up runs as a sequence of its own that borrows the request's whole blocks before its rows, starts
from a copy of the block they begin in, and writes into fresh blocks, all returned after the call. The taps go to the
draft only, which never changes output.

A hybrid target's linear-attention layers need their state before the first row too, and the request's own state is
the one after its last committed row. The catch-up starts from a state snapshot (kept for prefix caching,
BlocksAndSlots) at or before the first missing row, or from the zero state at row 0, passes that state in itself (the
request's state slot is left alone), and drops the taps of the rows before the missing ones.
"""

from __future__ import annotations

import numpy as np

from ovbuild.errors import CacheExhaustedError
from ovbuild.ir.ports import INPUT_IDS, LOGITS_INDICES, POSITION_IDS, STATE_ROWS
from ovbuild.runtime.cache.cache_manager import BlocksAndSlots
from ovbuild.runtime.cache.kv_cache import SequenceRows
from ovbuild.runtime.images import ImageCall
from ovbuild.runtime.model.paged_model import TAPS, PagedModel
from ovbuild.runtime.request import Request

CATCH_UP = -3  # the first catch-up sequence's id, the next ones count down (calibration -1, padding -2)


def catch_up_start(target: PagedModel, request: Request) -> tuple[int, dict[str, np.ndarray] | None]:
    """(row, state before it) where the request's catch-up starts: its first missing row (taps_len), or on a hybrid
    target the last row at or before it whose state a snapshot keeps (0 and the zero state without one)."""
    cache = target.cache_manager
    if not isinstance(cache, BlocksAndSlots):
        return request.taps_len, None
    return cache.state_before(request.block_hashes(cache.block_size, request.taps_len), request.taps_len)


def catch_up_rows(target: PagedModel, request: Request) -> int:
    """Rows the request's catch-up runs: its gap, and on a hybrid target the rows back to the state it starts from."""
    return request.target_len - catch_up_start(target, request)[0]


def catch_up(target: PagedModel, requests: list[Request], max_rows: int) -> list[Request]:
    """Run `target` over each request's gap (its committed rows without taps) and give the taps to the request, in
    one call of at most `max_rows` rows (one request at least); returns the requests caught up. A request is left
    out when the call is full or the cache has no free blocks for its rows."""
    allocator = target.cache.allocator
    images = ImageCall(target.image_width) if target.image_width is not None else None
    rows, ids, positions, last, done, skip, states = [], [], [], [], [], [], []
    try:
        for request in requests:
            (start, state), end = catch_up_start(target, request), request.target_len
            if done and len(ids) + end - start > max_rows:
                continue
            seq = CATCH_UP - len(done)
            try:
                partial = allocator.fork(seq, request.id, start, end)
            except CacheExhaustedError:
                continue
            done.append(request)
            if partial is not None:
                target.cache.copy_block(*partial)  # the committed rows before `start` in the block it begins in
            rows.append(SequenceRows(seq, start, end - start))
            if images is not None:  # the image rows' embeddings and three-axis positions, as the target call's
                images.add(request.images, start, end - start, len(ids))
            ids += request.committed(start, end)
            positions += range(start, end)
            last.append(len(ids) - 1)
            skip.append(request.taps_len - start)
            states.append(state)
        if not done:
            return []
        feeds = {INPUT_IDS: ids, POSITION_IDS: positions, LOGITS_INDICES: last}
        if images is not None:
            feeds |= images.inputs()
        if target.states is not None:
            feeds |= starting_states(target, states, last)
        out = target.run(rows, feeds)
        taps = out[TAPS]  # [rows, n * H]: each request copies its rows (Request.add_taps)
    finally:
        for i in range(len(done)):
            allocator.free(CATCH_UP - i)
    begin = 0
    for request, r, dropped in zip(done, rows, skip, strict=True):
        request.add_taps(taps, begin + dropped, r.num_rows - dropped)
        begin += r.num_rows
    return done


def starting_states(target: PagedModel, states: list[dict[str, np.ndarray] | None], last: list[int]) -> dict:
    """A hybrid target's state inputs for catch-up sequences starting from `states` (None: the zero state), reporting
    the state after each one's last packed row (`last`), which nobody keeps: passed in, they leave the pool alone."""
    feeds: dict[str, np.ndarray] = {}
    for spec in target.states.specs:
        zero = np.zeros(spec.shape, np.float32)
        feeds[spec.name] = np.stack([zero if s is None else s[spec.name] for s in states])  # [S, *shape]
    feeds[STATE_ROWS] = np.array(last, np.int64)  # [S]
    return feeds

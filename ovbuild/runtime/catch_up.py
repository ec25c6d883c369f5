"""Catching up on taps: the target's taps of committed rows that ran without them, for a request that drafts again.

While drafting pays for nobody, the scheduler runs the target without its taps (PagedModel.can_skip_taps): on a small
target they cost about a tenth of a call. A request that is to draft again needs the taps of every token its draft has
not seen, so the target runs once more over those rows. It must not write the request's cache: its rows would
overwrite committed keys and values with ones computed in another kernel (a prompt chunk ran as one subsequence), and
the target alone's rounding is what greedy output must keep. So each request's catch-up runs as a sequence of its own
that borrows the request's whole blocks before its rows, starts from a copy of the block they begin in, and writes into
fresh blocks, all returned after the call. The taps go to the draft only, which never changes output.
"""

from __future__ import annotations

import numpy as np

from ovbuild.errors import CacheExhaustedError
from ovbuild.ir.ports import INPUT_IDS, LOGITS_INDICES, POSITION_IDS
from ovbuild.runtime.cache.kv_cache import SequenceRows
from ovbuild.runtime.model.paged_model import TAPS, PagedModel
from ovbuild.runtime.request import Request

CATCH_UP = -3  # the first catch-up sequence's id, the next ones count down (calibration -1, padding -2)


def catch_up(target: PagedModel, requests: list[Request], max_rows: int) -> list[Request]:
    """Run `target` over each request's gap (its committed rows without taps) and give the taps to the request, in
    one call of at most `max_rows` rows (one request at least); returns the requests caught up. A request is left
    out when the call is full or the cache has no free blocks for its rows."""
    allocator = target.cache.allocator
    rows, ids, positions, last, done = [], [], [], [], []
    try:
        for request in requests:
            start, end = request.taps_len, request.target_len
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
            ids += request.committed(start, end)
            positions += range(start, end)
            last.append(len(ids) - 1)
        if not done:
            return []
        out = target.run(rows, {INPUT_IDS: ids, POSITION_IDS: positions, LOGITS_INDICES: last})
        taps = np.array(out[TAPS])  # [rows, n * H]: a copy, the output tensor is the next call's
    finally:
        for i in range(len(done)):
            allocator.free(CATCH_UP - i)
    begin = 0
    for request, r in zip(done, rows, strict=True):
        request.add_taps(taps[begin : begin + r.num_rows])
        begin += r.num_rows
    return done

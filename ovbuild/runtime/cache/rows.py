"""Where each sequence of a packed call stands: the one description of a call's rows every cache reads."""

from __future__ import annotations

from typing import NamedTuple


class SequenceRows(NamedTuple):
    """One sequence's part of a packed call: its id, tokens already cached, and rows written by this call (a tuple:
    the scheduler makes one per request per call, and a frozen dataclass took 3x as long to make)."""

    seq_id: int
    past_len: int
    num_rows: int


def sequence_rows(seq_id: int, past_len: int, num_rows: int, one_per_row: bool) -> list[SequenceRows]:
    """A sequence's rows of a call: one subsequence, or (one_per_row) a 1-row subsequence per row, each attending to
    the rows before it (how verification rows run on CPU: see PagedModel.row_subsequences)."""
    if one_per_row:
        return [SequenceRows(seq_id, past_len + i, 1) for i in range(num_rows)]
    return [SequenceRows(seq_id, past_len, num_rows)]

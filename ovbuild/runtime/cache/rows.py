"""Where each sequence of a packed call stands: the one description of a call's rows every cache reads, and how a
request's rows are laid out so that each computes alike in any call (batch invariance, docs/invariance.md)."""

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


# The CPU plugin's PagedAttention computes a 1-row subsequence in its decode kernel and a longer one in its prompt
# kernel, which round differently (by up to 3 in the logits of a Qwen3-4B-wide target with bf16 math), while a row
# computes bitwise alike in either kernel whatever else its call holds and wherever a prompt is cut into chunks of 2
# rows or more (bench/bench_invariance.py). So each row keeps one kernel whatever its call: a prompt row runs in a
# chunk of at least 2 rows (a 1-token prompt's row alone), a generated row as a 1-row subsequence, also when a
# preempted request computes its generated tokens again. Those run in calls after its prompt's last chunk: 1-row
# subsequences after a longer one of the same sequence in one call do not see its rows (their logits were off by up
# to 0.9 on the tiny target).
MIN_PROMPT_CHUNK = 2


def prompt_chunk(left: int, budget: int, prompt_left: int) -> int:
    """Rows of a prefilling request's next chunk: `left` rows to go (`prompt_left` of them prompt rows; the others are
    the generated tokens a preempted request computes again) and `budget` rows left in the call. At most the budget
    (at least 1) and no further than the prompt's end, except that the chunk never holds one prompt row of several
    nor leaves one behind: there the budget gives way (by at most 2 rows)."""
    n = min(left, max(budget, 1))
    if prompt_left <= 0:
        return n
    n = min(n, prompt_left)
    if n < MIN_PROMPT_CHUNK <= prompt_left:
        n = MIN_PROMPT_CHUNK
    if prompt_left - n == 1:
        n += 1
    return n

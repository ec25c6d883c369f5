"""The rows a constrained request chooses its tokens from: biased, and masked with the matcher's state before each row.

Row j of a verification [anchor, d1..dk] is masked with the grammar's state after d1..dj-1 (the tokens that are
committed by the time row j's token counts), so each row is what the target alone would have seen at that output
position. Masks are computed when a row is first read: verification usually stops after a few rows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from ovbuild.runtime.structured.state import OutputConstraint


class ConstrainedRows:
    """Rows [k + 1, V] (logits or penalized rows) read through a request's constraint, row j after draft[:j];
    `close` rolls the matcher back over the draft tokens reading consumed (call it once the rows are read)."""

    def __init__(self, logits, constraint: OutputConstraint, draft: list[int]):
        self.logits, self.constraint, self.draft = logits, constraint, draft
        self.start = constraint.opens_at(draft)  # rows from this one on are masked (None: no row is)
        self.consumed = 0  # draft tokens the matcher has consumed for the rows read so far
        self.rows: dict[int, np.ndarray] = {}
        self.dead: set[int] = set()  # rows where the grammar allows no token

    @property
    def shape(self) -> tuple[int, ...]:
        return self.logits.shape

    def __getitem__(self, i: int) -> np.ndarray:
        if i not in self.rows:
            row = np.array(self.logits[i], np.float32)
            self.constraint.bias(row)
            if self.constraint.matcher is not None and self.start is not None and i >= self.start:
                allowed = self._mask_at(i)
                if allowed is None:
                    self.dead.add(i)  # left unmasked: whatever it picks, the matcher refuses it and the request ends
                else:
                    row[~allowed] = -np.inf
            self.rows[i] = row
        return self.rows[i]

    def argmax(self, i: int) -> int:
        return int(np.argmax(self[i]))

    def _mask_at(self, i: int) -> np.ndarray | None:
        """The allowed tokens after draft[start:i]: the matcher is moved there (forward by consuming, back by rolling
        back) and stays until `close`."""
        matcher, want = self.constraint.matcher, i - self.start
        if want < self.consumed:
            matcher.rollback(self.consumed - want)
            self.consumed = want
        while self.consumed < want:
            token = self.draft[self.start + self.consumed]
            if not self.constraint.accepts(token):
                return None  # a refused draft token: rows after it are never reached by a verification
            matcher.consume_token(token)
            self.consumed += 1
        return self.constraint.mask()

    def close(self) -> None:
        """Put the matcher back where it was before the rows were read."""
        if self.consumed:
            self.constraint.matcher.rollback(self.consumed)
            self.consumed = 0

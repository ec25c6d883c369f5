"""A test drafter that accepts: a real drafter whose proposals are replaced by the target's own continuation with
wrong tokens at chosen positions.

Tiny random drafts almost never guess the target's next token, so with them rollback, acceptance bookkeeping and
metrics run only on the "nothing accepted" path. Steering keeps every part of a real draft step (the wrapped drafter
still runs each call, so its cache, context commits and family-specific head run as in production) and makes every
accepted-prefix length and every rejection position occur. It also checks the scheduler's side of the contract: the
anchor of every call must be the committed token at the position the draft's context has reached.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import numpy as np

from ovbuild.runtime.cache.cache_manager import CacheManager
from ovbuild.runtime.speculation.drafters.base import Drafter, DraftItem, Proposal


@dataclass
class SteeringLog:
    """What the steered drafter proposed: per request, the number of correct tokens before the first wrong one,
    and the number proposed, for every step that proposed something."""

    steps: dict[int, list[tuple[int, int]]] = field(default_factory=dict)  # seq -> [(proposed, correct prefix)]

    def histogram(self) -> list[int]:
        """Steps by correct-prefix length: [steps with 0 correct, 1 correct, ...]."""
        counts: list[int] = []
        for proposed_correct in self.steps.values():
            for _, correct in proposed_correct:
                counts.extend([0] * (correct + 1 - len(counts)))
                counts[correct] += 1
        return counts


class SteeredDrafter(Drafter):
    """Wraps `inner`; proposes `truths[seq_id]` (prompt + the target alone's tokens) from the anchor on, with one
    token changed at a position drawn uniformly from 0..k per step (k = all correct)."""

    def __init__(
        self,
        inner: Drafter,
        vocab_size: int,
        seed: int = 0,
        wrong_rate: float = 1.0,
        wrong_at: int | None = None,
        first_misses: int = 0,
        accept_chance: float | None = None,
    ):
        self.inner, self.vocab_size, self.seed = inner, vocab_size, seed
        self.rng = np.random.default_rng(seed)
        self.wrong_rate = wrong_rate  # chance that a step holds a wrong token at all
        self.wrong_at = wrong_at  # the wrong token's position in every step, instead of a random one
        self.first_misses = first_misses  # proposals wrong at their first token before the rules above apply
        # instead of a uniform position: each token right with this chance once those before it are, so that the
        # first wrong one is at j with chance a^j (1 - a), the constant-per-position acceptance of a published draft.
        # Which tokens are wrong is drawn once per text (right_positions), not per call: as with a real draft, the
        # acceptance belongs to the text, so every run of it (rounds of a benchmark, other draft lengths) meets the
        # same wrong tokens, and runs differ only in what they do with them.
        self.accept_chance = accept_chance
        self._right: dict[tuple[int, ...], np.ndarray] = {}
        self.calls = 0  # draft calls made
        self.truths: dict[int, list[int]] = {}  # filled by the test as it adds requests
        self.seen: dict[int, int] = {}  # context rows handed to the draft per sequence = tokens in the target cache
        self.log = SteeringLog()
        self.target_layer_ids, self.max_candidates = inner.target_layer_ids, inner.max_candidates
        self.candidate_offset, self.tap_width = inner.candidate_offset, inner.tap_width
        self.OPTIONS = inner.OPTIONS

    @classmethod
    def from_folder(cls, folder, model=None, **options) -> SteeredDrafter:
        raise NotImplementedError("wrap a loaded drafter: SteeredDrafter(drafter, vocab_size)")

    @property
    def infer_s(self) -> float:  # type: ignore[override]
        return self.inner.infer_s

    @property
    def compile_s(self) -> float:  # type: ignore[override]
        return self.inner.compile_s

    def compile_copies(self) -> None:
        self.inner.compile_copies()

    def describe(self) -> str:
        return self.inner.describe()

    def computed_rows(self, rows: int) -> int:
        return self.inner.computed_rows(rows)

    def rows_run(self, rows: int) -> int:
        return self.inner.rows_run(rows)

    def propose(self, items: list[DraftItem]) -> list[Proposal]:
        self.calls += 1
        real = self.inner.propose(items)
        proposals = []
        for item, own in zip(items, real, strict=True):
            position = self.seen.get(item.seq_id, 0) + (0 if item.context is None else len(item.context))
            self.seen[item.seq_id] = position
            if item.anchor is None or item.num_tokens == 0:
                assert own == [], f"sequence {item.seq_id}: the drafter proposed {own} without an anchor"
                proposals.append(Proposal())
                continue
            if item.seq_id not in self.truths:  # not a request of the test (the scheduler's cost calibration)
                proposals.append(own)
                continue
            proposals.append(Proposal(self._steer(item, position)))
        return proposals

    def _steer(self, item: DraftItem, position: int) -> list[int]:
        truth = self.truths[item.seq_id]
        assert position < len(truth) and item.anchor == truth[position], (
            f"sequence {item.seq_id}: anchor {item.anchor} at position {position} after the context the draft was "
            f"given, but the committed token there is {truth[position] if position < len(truth) else 'past the end'}"
        )
        k = item.num_tokens
        proposal = list(truth[position + 1 : position + 1 + k])
        known = len(proposal)  # positions past the target's last token are unknown: filled, never counted
        proposal += [0] * (k - known)
        if self.accept_chance is not None:
            window = self.right_positions(truth)[position + 1 : position + 1 + k]
            wrong = int(np.argmin(window)) if not window.all() else k  # the first wrong one, or none
        else:
            wrong = int(self.rng.integers(0, k + 1)) if self.rng.random() < self.wrong_rate else k
        wrong = wrong if self.wrong_at is None else min(self.wrong_at, k)
        if self.first_misses > 0:
            self.first_misses -= 1
            wrong = 0
        if wrong < k:
            proposal[wrong] = (proposal[wrong] + 1 + int(self.rng.integers(0, self.vocab_size - 1))) % self.vocab_size
        if wrong <= known:
            self.log.steps.setdefault(item.seq_id, []).append((k, min(wrong, k)))
        return proposal

    def right_positions(self, truth: list[int]) -> np.ndarray:
        """accept_chance mode: per position of the text `truth`, whether a proposal of that token is right (each with
        chance accept_chance, drawn from the seed and the text alone). [len(truth)] bool."""
        key = tuple(truth)
        if key not in self._right:
            text = zlib.crc32(np.asarray(truth, np.int64).tobytes())
            self._right[key] = np.random.default_rng([self.seed, text]).random(len(truth)) < self.accept_chance
        return self._right[key]

    @property
    def cache_manager(self) -> CacheManager:
        return self.inner.cache_manager

    @property
    def prefix_caching(self) -> bool:  # type: ignore[override]
        return self.inner.prefix_caching

    def resume(self, seq_id: int, length: int) -> None:
        self.inner.resume(seq_id, length)
        self.seen[seq_id] = length

    def free(self, seq_id: int) -> None:
        self.inner.free(seq_id)
        self.seen.pop(seq_id, None)

"""A request's constraint while it decodes: the matcher (in step with the generated tokens), its logit bias, and the
reasoning gate (the constraint starts after a marker such as "</think>").

Where a token is chosen (a decode row, each verification row, the first token after the prompt) the row is read
through `ConstrainedRows` (rows.py): biased, and masked to the tokens the grammar allows after the tokens before that
row (verification row j after draft tokens d1..dj-1). Draft proposals are masked the same way before they are verified
(`allowed_proposal`): a draft never proposes a forbidden token. A sampled proposal is redrawn from its masked
distribution, which is then the q its verification reads (the rejection rule is exact for any proposal distribution,
but it must see the one the tokens were drawn from). After verification the matcher consumes the committed tokens
(`advance`); rejected draft tokens were never consumed, so nothing rolls back across steps, and a preempted request
keeps its matcher as it is: it resumes from the same generated tokens.
"""

from __future__ import annotations

import time

import numpy as np

from ovbuild.runtime.decode.sampling import SamplingParams, position_uniforms, race
from ovbuild.runtime.speculation.drafters.base import Proposal

COMPLETE, DEAD_END = "complete", "dead_end"  # why a constraint ends its request (commit.py maps them to finish reasons)


class OutputConstraint:
    """One request's constraint state: matcher (None: logit bias only), bias pairs, vocabulary, reasoning gate."""

    def __init__(
        self, matcher, bias: tuple[tuple[int, float], ...], vocab_size: int, gate: tuple[int, ...] = (), known: int = 0
    ):
        """known: the ids the grammar's tokenizer has (a model's vocabulary may be wider: the rest are never
        allowed, and never shown to the matcher, which would go into its error state for good)."""
        self.matcher, self.vocab_size, self.gate, self.known = matcher, vocab_size, tuple(gate), known
        self.bias_ids = np.array([t for t, _ in bias], np.int64)
        self.bias_values = np.array([v for _, v in bias], np.float32)
        self.recent: list[int] = []  # the last tokens before the gate opened (to find a marker split across steps)
        self.open = not self.gate or matcher is None
        self.mask_rows, self.mask_s = 0, 0.0  # masks computed and their seconds (the bench's cost per row)

    # -- the gate ------------------------------------------------------------------------------------------------

    def opens_at(self, tokens: list[int]) -> int | None:
        """Index into `tokens` from which the constraint is in force: 0 when open already, i + 1 when the marker
        ends at tokens[i], None when it does not open within them."""
        if self.open:
            return 0
        seen, n = list(self.recent), len(self.gate)
        for i, token in enumerate(tokens):
            seen.append(token)
            if tuple(seen[-n:]) == self.gate:
                return i + 1
        return None

    # -- rows ----------------------------------------------------------------------------------------------------

    def mask(self) -> np.ndarray | None:
        """The tokens the matcher allows now, as a bool [V]; None when it allows none (a dead end)."""
        start = time.perf_counter()
        bits = np.unpackbits(np.frombuffer(self.matcher.compute_bitmask(), np.uint8), bitorder="little")
        allowed = np.zeros(self.vocab_size, bool)
        n = min(len(bits), self.vocab_size)
        allowed[:n] = bits[:n].view(bool)
        self.mask_rows += 1
        self.mask_s += time.perf_counter() - start
        return allowed if allowed.any() else None

    def accepts(self, token: int) -> bool:
        """Whether the matcher can consume `token` now (without consuming it)."""
        return 0 <= token < self.known and self.matcher.validate_tokens([token]) == 1

    def bias(self, row: np.ndarray) -> None:
        """Add the logit bias to a float32 row in place."""
        if len(self.bias_ids):
            row[self.bias_ids] += self.bias_values

    # -- the draft -----------------------------------------------------------------------------------------------

    def allowed_proposal(self, proposal: Proposal, sampling: SamplingParams | None, position: int) -> Proposal:
        """The proposal as the draft makes it under the grammar: each row's token chosen among the tokens the grammar
        allows after the ones before it. A greedy proposal takes its rows' masked argmax where its token is refused
        (the first allowed token when a drafter gives no logits, as a test stand-in may); a sampled one is redrawn
        from q masked (with the same keys: the masked draw, which q then becomes for verification). It ends where the
        grammar is complete.
        `position`: the first token's output position (its random draws)."""
        start = self.opens_at(list(proposal))
        if self.matcher is None or start is None or not proposal:
            return proposal
        sampled = sampling is not None and proposal.q is not None
        logits = None if sampled else proposal.logits
        tokens, q, consumed = list(proposal[:start]), [], 0
        try:
            for j in range(start, len(proposal)):
                if self.matcher.is_stopped():
                    break
                token = proposal[j]
                if sampled:
                    token, row = self._masked_draw(proposal.q[j], sampling.rng_seed, position + j)
                    if row is None:
                        break
                    q.append(row)
                elif not self.accepts(token):
                    allowed = self.mask()
                    if allowed is None:
                        break
                    # the draft's best allowed token; without its scores the first allowed one, which keeps the
                    # proposal's length (the planner reads acceptance by position; a cut proposal would look like
                    # one that was never made)
                    best = np.where(allowed, logits[j], -np.inf) if logits is not None else allowed
                    token = int(np.argmax(best))
                self.matcher.consume_token(token)
                consumed += 1
                tokens.append(token)
        finally:
            self.matcher.rollback(consumed)
        if sampled:
            head = proposal.q[:start]
            return Proposal(tokens, np.concatenate([head, np.array(q)]) if q else head)
        return Proposal(tokens)

    def _masked_draw(self, q: np.ndarray, rng_seed: int, position: int) -> tuple[int, np.ndarray | None]:
        """A draw from q [V] restricted to the allowed tokens and renormalized (None when they have no mass)."""
        allowed = self.mask()
        row = np.where(allowed, q, 0.0) if allowed is not None else None
        if row is None or row.sum() <= 0:
            return -1, None
        row = row / row.sum()
        return race(row, position_uniforms(rng_seed, position, len(row)).token), row

    # -- after verification --------------------------------------------------------------------------------------

    def advance(self, tokens: list[int], masks: list | None = None) -> tuple[list[int], str | None]:
        """Consume committed tokens: returns those kept and, when the constraint ends the request, why: COMPLETE
        when the grammar is complete (its last token kept), else DEAD_END when a token was refused (a row that
        allowed none: the request stops before it, with what it has). `masks`, when given, gets the tokens the
        grammar allowed at each kept token's position (bool [V], None where it was not in force): the rows the
        logprobs are read from."""
        start = self.opens_at(tokens)
        if start is None or self.matcher is None:
            self._remember(tokens)
            if masks is not None:
                masks += [None] * len(tokens)
            return tokens, None
        if not self.open:
            self.open, self.recent = True, []
        if masks is not None:
            masks += [None] * start
        for i in range(start, len(tokens)):
            if masks is not None:
                masks.append(self.mask())
            if not self.accepts(tokens[i]):
                return tokens[:i], COMPLETE if self.matcher.is_accepting() else DEAD_END
            self.matcher.consume_token(tokens[i])
            if self.matcher.is_stopped():
                return tokens[: i + 1], COMPLETE
        return tokens, None

    def _remember(self, tokens: list[int]) -> None:
        self.recent = (self.recent + list(tokens))[-len(self.gate) :] if self.gate else []

"""Speculative sampling: which draft tokens a sampling request keeps, lossless in distribution.

Rows: p [K+1, V] is the target's processed distribution at the anchor row and after each of the K draft tokens;
draft tokens x_0..x_{K-1} sit at output positions n..n+K-1. Every rule returns the committed tokens: the accepted
draft tokens, then one token of the target (a residual draw at the first rejection, else the bonus from p[K]).

* stochastic drafts (x_i drawn from q_i): accept x_i when u_accept * q_i(x_i) < p_i(x_i), i.e. with probability
  min(1, p/q); at the first rejection draw from the residual max(0, p_i - q_i) (Leviathan et al. 2023).
* point-mass drafts (x_i a deterministic function of the draft outputs): draw the target's own token y_i from p_i
  (an exponential race with the position's keys); accept x_i when y_i = x_i, else commit y_i. That is: accept with
  probability p(x_i), on rejection a draw from p_i without x_i, the point-mass case of the rule above. The
  committed token is always the target's own draw, so the output is that of the target alone for the same seed,
  whatever the draft proposes.

All draws come from `position_uniforms(seed, position)`, so a position's outcome never depends on batch or K. Sampled
drafts race with the same keys as the target at that position, so with the point-mass rule (the "exact" verification,
the default) they are coupled to the target's own draw (Gumbel-max coupling): a draft close to the target proposes
the target's token, and the output is the target alone's for the seed. The "rejection" verification uses the stochastic
rule on them instead (sampling.VERIFICATIONS).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ovbuild.runtime.decode.penalties import PenalizedRows
from ovbuild.runtime.decode.sampling import SamplingParams, Uniforms, draw, position_uniforms, processed_probs, race


class ProcessedRows:
    """p of each verification row, computed when a rule first reads it: verification usually stops after a few rows,
    and one row of 151,936 logits costs ~1 ms."""

    def __init__(self, logits: np.ndarray | PenalizedRows, params: SamplingParams):
        self.logits, self.params, self.rows = logits, params, {}

    def __getitem__(self, i: int) -> np.ndarray:
        if i not in self.rows:
            self.rows[i] = processed_probs(self.logits[i][None], self.params)[0]
        return self.rows[i]


class RowUniforms:
    """Row i's uniforms: those of output position `first_position + i`, drawn when a rule first reads them."""

    def __init__(self, rng_seed: int, first_position: int, vocab_size: int):
        self.rng_seed, self.first_position, self.vocab_size = rng_seed, first_position, vocab_size

    def __getitem__(self, i: int) -> Uniforms:
        return position_uniforms(self.rng_seed, self.first_position + i, self.vocab_size)


Rows = np.ndarray | ProcessedRows  # p, indexed by row


def residual(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """The unnormalized residual max(0, p - q) [V]; p itself when p <= q everywhere (only rounding gets there)."""
    r = np.maximum(p - q, 0.0)
    return r if r.sum() > 0 else p


def verify_stochastic(p: Rows, q: np.ndarray, proposal: list[int], u: Sequence[Uniforms]) -> list[int]:
    """p [K+1, V], q [K, V] the draft's distributions the proposal was drawn from, u[i] row i's uniforms ->
    committed tokens."""
    for i, x in enumerate(proposal):
        if u[i].accept * q[i][x] >= p[i][x]:
            return [*proposal[:i], draw(residual(p[i], q[i]), u[i].residual)]
    return [*proposal, race(p[len(proposal)], u[len(proposal)].token)]


def verify_point_mass(p: Rows, proposal: list[int], u: Sequence[Uniforms]) -> list[int]:
    """p [K+1, V], a deterministic proposal, u[i] row i's uniforms -> committed tokens (each the target's own draw)."""
    for i in range(len(proposal) + 1):
        token = race(p[i], u[i].token)
        if i == len(proposal) or token != proposal[i]:
            return [*proposal[:i], token]
    raise AssertionError("unreachable")


def verify_sampled(
    logits: np.ndarray | PenalizedRows, proposal: list[int], q: np.ndarray | None, params: SamplingParams, position: int
) -> list[int]:
    """The scheduler's hook: logits [K+1, V] of the verification rows, q [K, V] or None (point masses, or no draft)
    -> committed tokens; the first verification row's token is output `position`. `logits` penalized rows
    (ovbuild.runtime.decode.penalties) for a request with penalties."""
    p, u = ProcessedRows(logits, params), RowUniforms(params.rng_seed, position, logits.shape[-1])
    if q is None or not proposal or params.verification == "exact":
        return verify_point_mass(p, proposal, u)
    return verify_stochastic(p, q, proposal, u)

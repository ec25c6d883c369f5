"""Sampling: the processed distribution p of a row of logits, and the random numbers each request draws from.

p is built as transformers and OpenVINO GenAI build it: temperature, then top-k (ties with the k-th value kept), then
top-p (the smallest head of the sorted distribution whose mass reaches top_p, renormalized after top-k). Draws are
exponential races (Gumbel-max) with keys that depend only on (rng_seed, output position, token), and the
acceptance and residual draws of speculative verification inverse-CDF draws from uniforms of (rng_seed, position):
see `position_uniforms`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ovbuild.errors import ConfigError


@dataclass(frozen=True)
class SamplingParams:
    """How one request samples: temperature > 0, top_k (0 = off), top_p in (0, 1] (1 = off), rng_seed >= 0, and how
    sampled draft tokens are verified (`VERIFICATIONS`)."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    rng_seed: int = 0
    verification: str = "exact"

    def __post_init__(self):
        check_sampling(self.temperature, self.top_k, self.top_p, self.rng_seed, do_sample=True)
        check_verification(self.verification)


# How a sampled draft token is verified (ovbuild.runtime.decode.verify):
# - "exact": the draft draws with the uniform the target draws that output position with, and a draft token is kept
#   when it equals the target's own draw. The output is the target alone's for the same seed, token for token,
#   whatever the batch and however many draft tokens each step verifies (so the adaptive choice of K cannot change it).
# - "rejection": Leviathan et al.'s rule, accept with min(1, p/q), else draw from the residual: the same distribution,
#   more tokens accepted when q is close to p, but which tokens come out depends on how many were verified each step.
VERIFICATIONS = ("exact", "rejection")


def check_verification(verification: str) -> None:
    if verification not in VERIFICATIONS:
        raise ConfigError(f"speculative_sampling '{verification}' is not one of {', '.join(VERIFICATIONS)}")


def check_sampling(temperature: float, top_k: int, top_p: float, rng_seed: int, do_sample: bool) -> None:
    """One-line ConfigError for a value GenAI would refuse (temperature only matters when sampling)."""
    if do_sample and not temperature > 0:
        raise ConfigError(f"temperature = {temperature}: sampling needs temperature > 0 (or do_sample=False)")
    if not 0 < top_p <= 1:
        raise ConfigError(f"top_p = {top_p} must lie in (0, 1] (1 = off)")
    if int(top_k) != top_k or top_k < 0:
        raise ConfigError(f"top_k = {top_k} must be an integer >= 0 (0 = off)")
    if int(rng_seed) != rng_seed or not 0 <= rng_seed < 2**64:
        raise ConfigError(f"rng_seed = {rng_seed} must be an integer in [0, 2**64)")


def processed_probs(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """logits [R, V] -> p [R, V] float64: softmax(logits / T), cut by top-k then top-p and renormalized."""
    p = np.empty(logits.shape, np.float64)
    for x, row in zip(logits, p, strict=True):  # a row at a time: a float64 row of 151,936 stays in cache
        np.multiply(x, 1.0 / params.temperature, out=row, dtype=np.float64)
        row -= row.max()
        np.exp(row, out=row)
        row /= row.sum()
        if 0 < params.top_k < row.size:
            _top_k(row, params.top_k)
        if params.top_p < 1:
            _top_p(row, params.top_p)
    return p


def _top_k(row: np.ndarray, k: int) -> None:
    """Zero every probability below the k-th largest (ties with it stay, as transformers keeps them); renormalize."""
    head = _head(row, lambda kept: len(kept) >= k)
    if len(head) <= k:  # k or fewer tokens have mass: nothing to cut
        return
    kth = np.partition(row[head], len(head) - k)[len(head) - k]
    row[row < kth] = 0.0
    row /= row.sum()


def _top_p(row: np.ndarray, top_p: float) -> None:
    """Keep the sorted head whose mass before each token is < top_p (the token crossing top_p stays); renormalize."""
    head = _head(row, lambda kept: row[kept].sum() >= top_p)
    order = head[np.argsort(-row[head], kind="stable")]  # descending, ties by token id
    before = np.cumsum(row[order]) - row[order]
    drop = np.ones(row.size, bool)
    drop[order[before < top_p]] = False
    row[drop] = 0.0
    row /= row.sum()


def _head(row: np.ndarray, enough) -> np.ndarray:
    """Indices of the tokens >= a threshold lowered by 16x until `enough(indices)`: a superset of any top-k / top-p
    head, found without sorting the whole vocabulary (a full argsort of 151,936 entries takes ~10 ms)."""
    threshold, support = row.max(), np.count_nonzero(row)
    while True:
        threshold /= 16
        kept = np.flatnonzero(row >= threshold)
        if len(kept) >= support or enough(kept):
            return kept


class Uniforms:
    """The random numbers of one output position: Exp(1) race keys of the token draw (one per vocabulary entry,
    made when first read), and the uniforms [0, 1) of the acceptance test and of the residual draw."""

    def __init__(self, token: np.ndarray | Callable[[], np.ndarray], accept: float, residual: float):
        self._token, self.accept, self.residual = token, accept, residual

    @property
    def token(self) -> np.ndarray:
        if callable(self._token):
            self._token = self._token()
        return self._token


def position_uniforms(rng_seed: int, position: int, vocab_size: int) -> Uniforms:
    """Counter-based: Philox keyed by the seed, counter blocks of their own per output position, so the draws of
    position n are the same whoever shares the batch, however many draft tokens a step verifies, with or without a
    draft."""
    accept, residual = np.random.Generator(np.random.Philox(key=rng_seed, counter=[0, position, 0, 0])).random(2)
    keys = np.random.Generator(np.random.Philox(key=rng_seed, counter=[0, position, 1, 0]))
    return Uniforms(lambda: keys.standard_exponential(vocab_size), float(accept), float(residual))


def race(p: np.ndarray, keys: np.ndarray) -> int:
    """The token draw: argmax p / keys over tokens with mass (keys Exp(1): an exponential race, Gumbel-max in
    another form), a draw from p normalized. Draft and target racing with the same keys propose the same token
    whenever their distributions are close: P(same) >= (1 - TV) / (1 + TV), whatever the vocabulary order."""
    score = np.divide(p, keys, out=np.zeros_like(p, dtype=np.float64), where=p > 0)
    return int(np.argmax(score))


def draw(p: np.ndarray, u: float) -> int:
    """Inverse-CDF draw of one token from p [V] (need not sum to 1) with the uniform u; never a token with p = 0."""
    cdf = np.cumsum(p)
    token = int(np.searchsorted(cdf, u * cdf[-1], side="right"))
    if token >= len(p) or p[token] <= 0:  # u * total rounded up to the total: the last token with mass
        token = int(np.flatnonzero(p > 0)[-1])
    return token


def sample_rows(logits: np.ndarray, params: SamplingParams, first_position: int) -> tuple[list[int], np.ndarray]:
    """A draft's sampled proposals: logits [R, V] of output positions first_position.. -> (tokens, q [R, V])."""
    q = processed_probs(logits, params)
    vocab = q.shape[-1]
    tokens = [race(row, position_uniforms(params.rng_seed, first_position + i, vocab).token) for i, row in enumerate(q)]
    return tokens, q

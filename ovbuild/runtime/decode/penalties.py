"""Logit penalties, applied to a row of the target's logits before greedy argmax or sampling (vLLM's semantics).

* repetition_penalty r (GenAI, vLLM, the CTRL paper's rule): the logit of every token seen in the prompt or the
  generated tokens is divided by r when positive and multiplied by r when negative (r > 1 discourages repeats);
* frequency_penalty f and presence_penalty a (OpenAI): logit -= f * count + a * (count > 0), over the generated
  tokens only (count: how often the token was generated so far);
* min_new_tokens m: while fewer than m tokens were generated, the EOS tokens' logits are -inf.

Rows are processed in this order (min_new_tokens, repetition, frequency and presence), in float32 as the logits are.
A verification row i sees the generated tokens and the draft tokens 1..i-1 before it (accepted by the time row i is
read), so each row is processed exactly as the target alone processes that output position.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np

from ovbuild.errors import ConfigError


@dataclass(frozen=True)
class Penalties:
    """A request's penalties (all off by default) and the tokens min_new_tokens holds back."""

    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    min_new_tokens: int = 0
    eos_token_ids: tuple[int, ...] = ()

    @property
    def active(self) -> bool:
        """Whether any penalty changes a row (else the logits are used as they are)."""
        return self.active_after(0)

    def active_after(self, generated: int) -> bool:
        """Whether a penalty changes the rows after `generated` output tokens (min_new_tokens alone stops then)."""
        return (
            self.repetition_penalty != 1.0
            or self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
            or (generated < self.min_new_tokens and bool(self.eos_token_ids))
        )


def check_penalties(repetition: float, presence: float, frequency: float, min_new_tokens: int) -> None:
    """One-line ConfigError naming the field of a value vLLM or GenAI would refuse."""
    for name, value in (
        ("repetition_penalty", repetition),
        ("presence_penalty", presence),
        ("frequency_penalty", frequency),
    ):
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise ConfigError(f"{name} must be a finite number, got {value!r}")
    if not repetition > 0:
        raise ConfigError(f"repetition_penalty = {repetition} must be > 0 (1 = off)")
    for name, value in (("presence_penalty", presence), ("frequency_penalty", frequency)):
        if not -2 <= value <= 2:
            raise ConfigError(f"{name} = {value} must lie in [-2, 2] (0 = off)")
    if isinstance(min_new_tokens, bool) or not isinstance(min_new_tokens, numbers.Integral) or min_new_tokens < 0:
        raise ConfigError(f"min_new_tokens must be an integer >= 0, got {min_new_tokens!r}")


class PenalizedRows:
    """The penalized logits of a request's verification rows: row i after the generated tokens and the draft tokens
    before it, computed when first read (verification usually stops after a few rows)."""

    def __init__(self, logits: np.ndarray, penalties: Penalties, prompt: np.ndarray, generated: list[int], draft):
        self.logits, self.penalties, self.generated, self.draft = logits, penalties, generated, list(draft)
        self.prompt_seen = np.unique(np.asarray(prompt, np.int64)) if penalties.repetition_penalty != 1.0 else None
        self.rows: dict[int, np.ndarray] = {}

    @property
    def shape(self) -> tuple[int, ...]:
        return self.logits.shape

    def __getitem__(self, i: int) -> np.ndarray:
        if i not in self.rows:
            self.rows[i] = penalize(self.logits[i], self.penalties, self.prompt_seen, self.generated + self.draft[:i])
        return self.rows[i]

    def argmax(self, i: int) -> int:
        return int(np.argmax(self[i]))


def penalize(logits: np.ndarray, penalties: Penalties, prompt_seen: np.ndarray | None, generated: list[int]):
    """logits [V] -> a penalized float32 copy; prompt_seen: the prompt's distinct tokens (for repetition_penalty);
    generated: the output tokens before this position."""
    row = np.array(logits, np.float32)
    if len(generated) < penalties.min_new_tokens and penalties.eos_token_ids:
        row[list(penalties.eos_token_ids)] = -np.inf
    tokens, counts = np.unique(np.asarray(generated, np.int64), return_counts=True)
    if penalties.repetition_penalty != 1.0:
        seen = np.union1d(prompt_seen, tokens) if prompt_seen is not None else tokens
        x = row[seen]
        r = np.float32(penalties.repetition_penalty)
        row[seen] = np.where(x > 0, x / r, x * r)
    if len(tokens):
        row[tokens] -= np.float32(penalties.frequency_penalty) * counts.astype(np.float32)
        row[tokens] -= np.float32(penalties.presence_penalty)
    return row

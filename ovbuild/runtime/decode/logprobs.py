"""Log-probabilities of tokens: log-softmax of the target's raw logits (before penalties, temperature, top-k/top-p:
vLLM's default), for the generated tokens and, on request, the prompt's."""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np

from ovbuild.errors import ConfigError

MAX_LOGPROBS = 20  # the most alternatives a position reports (OpenAI's limit)


# Prompt rows a call computes the logits of for one request asking for prompt logprobs: each row's logits are a whole
# vocabulary of floats (512 rows of Qwen3's 151,936 are 311 MB), so such a prompt runs in chunks of at most this many
# rows, whatever the call's token budget.
PROMPT_LOGPROB_ROWS = 512


@dataclass(frozen=True)
class TokenLogprob:
    """One position: the token, its logprob, and the `top` most likely tokens with theirs (most likely first)."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def check_logprobs(value: object, name: str) -> None:
    """None (off) or an integer in 0..MAX_LOGPROBS: how many alternatives each position reports."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 0 <= value <= MAX_LOGPROBS:
        raise ConfigError(f"{name} must be an integer in [0, {MAX_LOGPROBS}] (or None: off), got {value!r}")


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """logits [V] -> log-probabilities [V] in float64."""
    x = np.asarray(logits, np.float64)
    shifted = x - x.max()
    return shifted - np.log(np.exp(shifted).sum())


def token_logprob(logits: np.ndarray, token: int, top: int) -> TokenLogprob:
    """The logprob of `token` under the row `logits` [V], with the `top` most likely tokens (ties by token id); a row
    masked with -inf (a grammar's) lists only the tokens it allows, so fewer than `top` where it allows fewer."""
    lp = log_softmax(logits)
    best: tuple[tuple[int, float], ...] = ()
    if top:
        head = np.argpartition(-lp, top - 1)[:top] if top < lp.size else np.arange(lp.size)
        head = head[np.lexsort((head, -lp[head]))]  # most likely first, ties by token id
        best = tuple((int(t), float(lp[t])) for t in head if np.isfinite(lp[t]))
    return TokenLogprob(int(token), float(lp[token]), best)

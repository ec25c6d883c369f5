"""What a request keeps from its rows of a target call: the tokens verification accepts, the first token after its
prompt, the tokens appended under its stop rules (with their logprobs), and its prompt's logprobs.

Pure functions of a request and its rows' outputs: the scheduler decides which rows a request gets and what its caches
keep; these decide which tokens it gets.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ovbuild.runtime.decode.detokenizer import Detokenizer
from ovbuild.runtime.decode.logprobs import token_logprob
from ovbuild.runtime.decode.penalties import PenalizedRows
from ovbuild.runtime.decode.verify import verify_sampled
from ovbuild.runtime.request import FinishReason, Request, Status
from ovbuild.runtime.structured.rows import ConstrainedRows
from ovbuild.runtime.structured.state import COMPLETE


def verified_tokens(request: Request, greedy: list[int], logits: np.ndarray) -> list[int]:
    """The tokens a decoding request commits from its verification rows [anchor, d1..dk]: the accepted draft tokens,
    then the target's own (greedy: its argmax; sampling: ovbuild.runtime.decode.verify). greedy: the in-graph argmax of
    each row; logits [k + 1, V]."""
    proposal, sampling = request.proposal, request.config.sampling
    rows = constrained(request, penalized(request, logits, proposal), logits, proposal)
    try:
        if sampling is None:
            # with penalties or a constraint, the argmax of the processed rows on the host, row by row as
            # verification reads them
            best = greedy.__getitem__ if rows is None else rows.argmax
            accepted = 0
            while accepted < len(proposal) and proposal[accepted] == best(accepted):
                accepted += 1
            return [*proposal[:accepted], best(accepted)]
        q = proposal.q  # a sampled proposal's draft distributions; None: point masses
        return verify_sampled(logits if rows is None else rows, list(proposal), q, sampling, len(request.generated))
    finally:
        if request.constraint is not None:
            rows.close()  # the matcher back before the draft tokens: it consumes the committed ones (append_tokens)


def first_token(request: Request, greedy: int, logits: np.ndarray) -> int:
    """The token after a request's prompt, from the last prompt row: greedy its argmax (the in-graph one, or that of
    the penalized row), else a draw. logits [1, V]."""
    sampling = request.config.sampling
    rows = constrained(request, penalized(request, logits), logits)
    if sampling is None:
        return greedy if rows is None else rows.argmax(0)
    return verify_sampled(logits if rows is None else rows, [], None, sampling, 0)[0]


def append_tokens(
    request: Request, tokens: list[int], logits: np.ndarray, detokenize: Callable[[list[int]], str] | None
) -> None:
    """Append new tokens, stopping at EOS (not kept), max_new_tokens, a stop string (text cut before it; needs
    `detokenize`) or the end of the request's grammar (OutputConstraint.advance); logits [len(tokens), V]: the rows
    they were chosen from (their logprobs, when the request asks)."""
    config = request.config
    before = len(request.generated)
    ended = None  # a constraint's reason to end the request (its grammar is complete, or allows no token)
    masks = [] if config.logprobs is not None else None  # what the grammar allowed at each kept token
    if request.constraint is not None:
        tokens, ended = request.constraint.advance(tokens, masks)
    for i, (token, row) in enumerate(zip(tokens, logits, strict=False)):
        if token in config.eos_token_ids:
            request.finish_reason = FinishReason.STOP
            break
        request.generated.append(token)
        if config.logprobs is not None:
            # under a grammar, from the row it masked (vLLM's default: the bitmask precedes its raw logprobs)
            mask = masks[i] if i < len(masks) else None
            row = row if mask is None else np.where(mask, row, -np.inf)
            request.logprobs.append(token_logprob(row, token, config.logprobs))
        if request.remaining <= 0:
            request.finish_reason = FinishReason.LENGTH
            break
    if config.stop_strings and detokenize is not None:
        if request.detokenizer is None:
            request.detokenizer = Detokenizer(detokenize, config.stop_strings)
        text = request.detokenizer.find_stop(request.generated, len(request.generated) - before)
        if text is not None:
            request.text, request.finish_reason = text, FinishReason.STOP_STRING
            del request.logprobs[len(request.generated) :]  # those of the tokens cut with the stop string
    if request.finish_reason is None and ended is not None:
        request.finish_reason = FinishReason.STOP if ended == COMPLETE else FinishReason.GRAMMAR
    if request.finish_reason is not None:
        request.status = Status.FINISHED


def record_prompt_logprobs(request: Request, start: int, logits: np.ndarray) -> None:
    """Record the logprobs of the prompt tokens a prefill chunk's rows (from position `start`) predict; rows past the
    prompt (a preempted request's generated tokens) and positions already recorded (before a preemption) are not."""
    if not request.prompt_logprobs:
        request.prompt_logprobs.append(None)  # the first prompt token: nothing predicts it
    for j, row in enumerate(logits):
        position = start + j + 1
        if position == len(request.prompt_logprobs) and position < len(request.prompt):
            request.prompt_logprobs.append(
                token_logprob(row, int(request.prompt[position]), request.config.prompt_logprobs)
            )


def penalized(request: Request, logits: np.ndarray, draft: list[int] = ()) -> PenalizedRows | None:
    """The request's rows with its penalties applied (row i after the draft tokens before it), None without any."""
    penalties = request.config.penalties
    if penalties is None or not penalties.active_after(len(request.generated)):
        return None  # the logits as they are: greedy keeps the in-graph argmax
    return PenalizedRows(logits, penalties, request.prompt, request.generated, draft)


def constrained(request: Request, rows: PenalizedRows | None, logits: np.ndarray, draft: list[int] = ()):
    """The request's rows read through its constraint (biased, masked per row; ovbuild.runtime.structured), else
    `rows` as they were."""
    if request.constraint is None:
        return rows
    return ConstrainedRows(logits if rows is None else rows, request.constraint, list(draft))

"""Prompts as callers give them (text, token ids, one or many) and the limits a target puts on them."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ovbuild.errors import RequestError

Prompt = str | list[int]


def prompt_list(prompts) -> tuple[list[Prompt], bool]:
    """(prompts, whether one prompt was given): a str or a list of ints is one prompt; a list of str / id lists many.

    A list of ints is one tokenized prompt, never a batch of one-token prompts, as in the OpenAI API."""
    if isinstance(prompts, str) or _is_ids(prompts):
        return [_one(prompts)], True
    if isinstance(prompts, np.ndarray) and prompts.ndim == 2:
        prompts = list(prompts)
    if not isinstance(prompts, list | tuple) or not prompts:
        raise RequestError("prompt must be a string, a list of token ids, or a non-empty list of either", "prompt")
    return [_one(p) for p in prompts], False


def _is_ids(value) -> bool:
    if isinstance(value, np.ndarray):
        return value.ndim == 1 and np.issubdtype(value.dtype, np.integer)
    return isinstance(value, list | tuple) and bool(value) and all(_is_int(v) for v in value)


def _is_int(value) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def _one(prompt) -> Prompt:
    if isinstance(prompt, str):
        return prompt
    if _is_ids(prompt):
        return [int(v) for v in prompt]
    raise RequestError(f"a prompt must be a string or a non-empty list of token ids, got {prompt!r:.60}", "prompt")


@dataclass(frozen=True)
class PromptLimits:
    """The target's vocabulary and context length (None = unknown: only the KV cache size limits a request)."""

    vocab_size: int | None = None
    context_length: int | None = None

    @classmethod
    def from_pipeline(cls, pipeline) -> PromptLimits:
        """The limits the pipeline itself enforces: the target IR's vocabulary and the effective max_model_len (the
        target's context length, or --max-model-len), so the API refuses exactly what the scheduler would."""
        return cls(pipeline.target.vocab_size, pipeline.max_model_len)

    def check_ids(self, ids: list[int]) -> None:
        """Refuse an empty prompt or ids outside the vocabulary before they reach an embedding gather."""
        if not ids:
            raise RequestError("the prompt is empty: at least one token is needed", "prompt")
        bad = [i for i in ids if i < 0 or (self.vocab_size is not None and i >= self.vocab_size)]
        if bad:
            raise RequestError(f"token id {bad[0]} is outside the vocabulary [0, {self.vocab_size})", "prompt")

    def max_new_tokens(self, prompt_len: int, requested: int | None, default: int) -> int:
        """The completion budget: `requested` if the context holds it (else an error), or `default` capped to it."""
        if self.context_length is None:
            return default if requested is None else requested
        room = self.context_length - prompt_len
        if room <= 0:
            raise RequestError(
                f"the prompt has {prompt_len} tokens; this model's maximum context length is {self.context_length}",
                "prompt",
            )
        if requested is not None and requested > room:
            raise RequestError(
                f"this model's maximum context length is {self.context_length} tokens, but {prompt_len + requested} "
                f"were requested ({prompt_len} in the prompt, {requested} for the completion)",
                "max_tokens",
            )
        return min(default, room) if requested is None else requested

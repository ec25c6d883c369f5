"""The OpenAI API's request bodies (validated by pydantic), the one mapping to a GenerationConfig, and the responses.

Fields the API defines but ovbuild cannot honour yet are accepted by the schema and refused by name in
`generation_config` (a 400, never a silent change of meaning); unknown fields are ignored, as OpenAI does.
"""

from __future__ import annotations

import dataclasses
import secrets
import time
import uuid
from collections.abc import Callable

from pydantic import BaseModel, ConfigDict, Field

from ovbuild.errors import RequestError
from ovbuild.runtime.decode.logprobs import MAX_LOGPROBS, TokenLogprob
from ovbuild.runtime.prompts import PromptLimits
from ovbuild.runtime.request import GenerationConfig
from ovbuild.serve.chat_output import ChatParsing

Scored = list[tuple[int, TokenLogprob | None]]  # (token, its logprob entry; None for a prompt's first token)


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptions(_Body):
    include_usage: bool = False


class SamplingFields(_Body):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1)
    n: int = Field(1, ge=1, le=128)
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float = Field(0.0, ge=-2, le=2, allow_inf_nan=False)
    frequency_penalty: float = Field(0.0, ge=-2, le=2, allow_inf_nan=False)
    repetition_penalty: float = Field(1.0, gt=0, allow_inf_nan=False)  # vLLM's and GenAI's extension (1 = off)
    min_tokens: int = Field(0, ge=0)  # vLLM's extension: no EOS before this many tokens
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    ignore_eos: bool = False  # vLLM's extension: generate max_tokens tokens whatever the model says
    num_assistant_tokens: int | None = Field(None, ge=0)  # ovbuild's: draft tokens verified per step
    # structured output (ovbuild.serve.structured): OpenAI's response_format, vLLM's structured_outputs and guided_*
    response_format: dict | None = None
    structured_outputs: dict | None = None
    guided_json: dict | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(SamplingFields):
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = Field(None, ge=0)  # 0 only with echo: the prompt's logprobs alone
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    best_of: int | None = None
    suffix: str | None = None


class ChatMessage(_Body):
    model_config = ConfigDict(extra="allow")  # name, tool_calls, ... reach the template as they came

    role: str
    content: str | list[dict] | None = None


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    tools: list[dict] | None = None
    tool_choice: str | dict | None = None
    add_generation_prompt: bool = True
    chat_template_kwargs: dict | None = None


def generation_config(
    body: SamplingFields,
    prompt_len: int,
    base: GenerationConfig,
    limits: PromptLimits,
    default_max_tokens: int,
    sample: int = 0,
    structured: dict | None = None,
) -> GenerationConfig:
    """The one place an API request becomes a GenerationConfig: budget, stops, EOS, sampling, penalties and logprobs.
    temperature absent or 0 (or top_k 1) is greedy, so that answers equal the target's own unless a client asks to
    sample; top_k -1 (vLLM) and 0 (GenAI) are off; without a seed a sampling request draws one; sample i of n samples
    with the seed `seed + i`. max_tokens 0 (echo alone) runs one token, which the answer leaves out. `structured`:
    the constraint and logit_bias fields (ovbuild.serve.structured). Raises RequestError naming the field."""
    _refuse_unsupported(body)
    _check_seed(body)
    structured = structured or {}
    requested = getattr(body, "max_completion_tokens", None) or body.max_tokens
    if body.max_tokens == 0 and not getattr(body, "echo", False):
        raise RequestError("max_tokens = 0 needs echo: true (the prompt's logprobs alone)", "max_tokens")
    stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    max_new_tokens = limits.max_new_tokens(prompt_len, requested or None, default_max_tokens)
    if body.max_tokens == 0:
        max_new_tokens = 1
    elif body.min_tokens > max_new_tokens:
        raise RequestError(f"min_tokens = {body.min_tokens} is more than max_tokens = {max_new_tokens}", "min_tokens")
    return dataclasses.replace(
        base,
        max_new_tokens=max_new_tokens,
        stop_strings=tuple(s for s in stop if s),
        eos_token_ids=() if body.ignore_eos else base.eos_token_ids,
        num_assistant_tokens=body.num_assistant_tokens,
        repetition_penalty=body.repetition_penalty,
        presence_penalty=body.presence_penalty,
        frequency_penalty=body.frequency_penalty,
        min_new_tokens=0 if body.max_tokens == 0 else body.min_tokens,
        **_logprobs(body),
        **_sampling(body, sample),
        **structured,
    )


def _logprobs(body: SamplingFields) -> dict:
    """GenerationConfig's logprobs and prompt_logprobs: completions' `logprobs` (and with `echo` the prompt's),
    chat's `logprobs` with `top_logprobs` alternatives."""
    if isinstance(body, ChatCompletionRequest):
        if body.top_logprobs is not None and not body.logprobs:
            raise RequestError("top_logprobs needs logprobs: true", "top_logprobs")
        return {"logprobs": (body.top_logprobs or 0) if body.logprobs else None}
    logprobs = getattr(body, "logprobs", None)
    echoed = logprobs if getattr(body, "echo", False) else None
    return {"logprobs": logprobs, "prompt_logprobs": echoed}


def _sampling(body: SamplingFields, sample: int) -> dict:
    if not body.temperature or body.top_k == 1:
        return {"do_sample": False}
    seed = body.seed + sample if body.seed is not None else secrets.randbits(63)
    top_k = body.top_k if body.top_k is not None and body.top_k > 0 else 0
    top_p = body.top_p if body.top_p is not None else 1.0
    return {"do_sample": True, "temperature": body.temperature, "top_k": top_k, "top_p": top_p, "rng_seed": seed}


# Sample i of n draws with seed + i, and a seed is a 64-bit Philox key (ovbuild.runtime.decode.sampling).
SEED_LIMIT = 2**64


def _check_seed(body: SamplingFields) -> None:
    """A seed is in [0, 2**64 - n]: every sample's seed + i must be a 64-bit key (refused, not wrapped around)."""
    if body.seed is not None and not 0 <= body.seed <= SEED_LIMIT - body.n:
        raise RequestError(
            f"seed must be an integer in [0, 2**64 - n] = [0, {SEED_LIMIT - body.n}] (sample i of n draws with "
            f"seed + i), got {body.seed}",
            "seed",
        )


def _refuse_unsupported(body: SamplingFields) -> None:
    refusals = {
        "best_of": ((getattr(body, "best_of", None) or 1) > 1, "best_of > 1 is not supported"),
        "suffix": (bool(getattr(body, "suffix", None)), "suffix is not supported"),
    }
    for param, (refused, message) in refusals.items():
        if refused:
            raise RequestError(message, param)


def chat_messages(body: ChatCompletionRequest, images=None) -> list[dict]:
    """Messages as a template expects them: content a string (text parts of a list joined). `images` (the served
    model's `ServedImages`, None for a text-only target) takes messages with image_url parts: see
    `chat_messages_with_images`; without it they are refused by name."""
    return chat_messages_with_images(body, images)[0]


def chat_messages_with_images(body: ChatCompletionRequest, images=None) -> tuple[list[dict], list[tuple[str, str]]]:
    """The template's messages and the images they show, as (url, where) in order of appearance."""
    out, shown = [], []
    for i, message in enumerate(body.messages):
        m = message.model_dump(exclude_none=True)
        parts = m.get("content")
        if isinstance(parts, list):
            if not all(isinstance(p, dict) for p in parts):
                raise RequestError(f"messages[{i}].content: every content part is an object", "messages")
            kinds = {p.get("type") for p in parts}
            if images is not None and "image_url" in kinds:
                m["content"], found = images.message_content(parts, f"messages[{i}]")
                shown += found
            elif "image_url" in kinds:
                raise RequestError(
                    f"messages[{i}]: this model takes no images (its folder has no vision tower, "
                    f"openvino_vision_model.xml)",
                    "messages",
                )
            elif kinds - {"text"}:
                other = ", ".join(repr(k) for k in kinds - {"text"})
                raise RequestError(f"messages[{i}]: content parts are text or image_url, not {other}", "messages")
            else:
                m["content"] = "".join(p.get("text", "") for p in parts)
        m.setdefault("content", "")
        out.append(m)
    return out, shown


# -- responses -----------------------------------------------------------------------------------------------------


def error_body(message: str, kind: str, param: str | None = None, code: str | None = None) -> dict:
    """The OpenAI error shape: {"error": {"message", "type", "param", "code"}}."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


class Format:
    """How one endpoint shapes its answers: the whole response, stream chunks, the closing usage chunk; `token_text`
    renders one token id for the logprobs."""

    object: str
    chunk_object: str
    id_prefix: str

    def __init__(self, model: str, token_text: Callable[[int], str] = str):
        self.model, self.id, self.created = model, f"{self.id_prefix}-{uuid.uuid4().hex}", int(time.time())
        self.token_text = token_text

    def _envelope(self, kind: str, choices: list[dict]) -> dict:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": choices}

    def response(
        self,
        texts: list[str],
        reasons: list[str | None],
        prompt_tokens: int,
        completion_tokens: int,
        scored: list[Scored | None] | None = None,
    ):
        scored = scored or [None] * len(texts)
        choices = [self.choice(i, t, r, s) for i, (t, r, s) in enumerate(zip(texts, reasons, scored, strict=True))]
        return {**self._envelope(self.object, choices), "usage": usage(prompt_tokens, completion_tokens)}

    def chunk(self, index: int, text: str, reason: str | None, scored: Scored | None = None, offset: int = 0) -> dict:
        return self._envelope(self.chunk_object, [self.chunk_choice(index, text, reason, scored, offset)])

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int) -> dict:
        return {**self._envelope(self.chunk_object, []), "usage": usage(prompt_tokens, completion_tokens)}

    def opening_chunks(self, n: int) -> list[dict]:
        return []

    def choice(self, index: int, text: str, reason: str | None, scored: Scored | None) -> dict:
        raise NotImplementedError

    def chunk_choice(self, index: int, text: str, reason: str | None, scored: Scored | None, offset: int) -> dict:
        raise NotImplementedError


class CompletionFormat(Format):
    object = chunk_object = "text_completion"
    id_prefix = "cmpl"

    def choice(self, index, text, reason, scored, offset=0):
        logprobs = None if scored is None else self.logprobs(scored, offset)
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": reason}

    chunk_choice = choice

    def logprobs(self, scored: Scored, offset: int) -> dict:
        """The completions shape: parallel lists of tokens, their logprobs, {token: logprob} alternatives and each
        token's character offset in the choice's text. As OpenAI's legacy completions (and vLLM) do, the alternatives
        always hold the chosen token too: up to logprobs + 1 of them, one with `logprobs: 0`."""
        tokens, offsets = [], []
        for token, _ in scored:
            tokens.append(self.token_text(token))
            offsets.append(offset)
            offset += len(tokens[-1])
        return {
            "tokens": tokens,
            "token_logprobs": [None if e is None else e.logprob for _, e in scored],
            "top_logprobs": [None if e is None else self._alternatives(token, e) for token, e in scored],
            "text_offset": offsets,
        }

    def _alternatives(self, token: int, entry) -> dict[str, float]:
        """{text: logprob} of the most likely tokens, then the chosen one if it is not among them."""
        top = {self.token_text(t): v for t, v in entry.top}
        top.setdefault(self.token_text(token), entry.logprob)
        return top


class ChatFormat(Format):
    object, chunk_object, id_prefix = "chat.completion", "chat.completion.chunk", "chatcmpl"

    def __init__(self, model: str, token_text: Callable[[int], str] = str, parsing: ChatParsing | None = None):
        """parsing: how the answers are read for reasoning and tool calls (None: all content)."""
        super().__init__(model, token_text)
        self.parsing, self.streams = parsing, {}

    def choice(self, index, text, reason, scored):
        message, called = self.parsing.message(text) if self.parsing else ({"role": "assistant", "content": text}, 0)
        reason = "tool_calls" if called and reason == "stop" else reason
        return {"index": index, "message": message, "logprobs": self.logprobs(scored), "finish_reason": reason}

    def chunk_choice(self, index, text, reason, scored, offset=0):
        if self.parsing is None:
            delta = {"content": text} if text else {}
        else:
            stream = self.streams.setdefault(index, self.parsing.stream())
            delta = stream.feed(text, last=reason is not None)
            reason = "tool_calls" if stream.called and reason == "stop" else reason
        return {"index": index, "delta": delta, "logprobs": self.logprobs(scored), "finish_reason": reason}

    def logprobs(self, scored: Scored | None) -> dict | None:
        """The chat shape: {"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}."""
        if scored is None:
            return None
        return {
            "content": [
                {**self._entry(token, e.logprob), "top_logprobs": [self._entry(t, v) for t, v in e.top]}
                for token, e in scored
            ]
        }

    def _entry(self, token: int, logprob: float) -> dict:
        text = self.token_text(token)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8", "surrogatepass"))}

    def opening_chunks(self, n: int) -> list[dict]:
        """The assistant role comes first in a chat stream, as OpenAI sends it."""
        role = {"role": "assistant", "content": ""}
        return [
            self._envelope(self.chunk_object, [{"index": i, "delta": role, "logprobs": None, "finish_reason": None}])
            for i in range(n)
        ]

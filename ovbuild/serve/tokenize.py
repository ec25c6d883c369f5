"""vLLM's tokenizer endpoints, in its request and response shapes: POST /tokenize (a prompt, or chat messages through
the template), POST /detokenize, GET /tokenizer_info. Clients that count or cut tokens themselves
(lm-evaluation-harness's `tokenizer_backend=remote`) read the served model's own tokenizer through them."""

from __future__ import annotations

from fastapi import FastAPI
from pydantic import Field
from starlette.concurrency import run_in_threadpool

from ovbuild.errors import RequestError
from ovbuild.serve.model import ServedModel
from ovbuild.serve.protocol import ChatMessage, _Body, chat_messages_with_images


class TokenizeCompletionRequest(_Body):
    model: str | None = None
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool | None = False


class TokenizeChatRequest(_Body):
    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    return_token_strs: bool | None = False
    chat_template_kwargs: dict | None = None


class DetokenizeRequest(_Body):
    model: str | None = None
    tokens: list[int]


def add_tokenizer_routes(app: FastAPI, model: ServedModel) -> None:
    """Register /tokenize, /detokenize and /tokenizer_info for `model`."""

    @app.post("/tokenize")
    async def tokenize(body: TokenizeChatRequest | TokenizeCompletionRequest):
        model.resolve(body.model)
        if isinstance(body, TokenizeChatRequest):
            if body.continue_final_message and body.add_generation_prompt:
                raise RequestError(
                    "continue_final_message and add_generation_prompt cannot both be true", "continue_final_message"
                )
            messages, shown = chat_messages_with_images(body, model.images)
            text = _render(model, body, messages)
            if shown:  # each image's placeholder run written out, as the chat endpoint's prompt holds it
                text = await run_in_threadpool(model.images.expanded_text, text, shown)
        else:
            text = body.prompt
        ids = model.tokenize(text, body.add_special_tokens)
        strs = [model.token_text(t) for t in ids] if body.return_token_strs else None
        return {"count": len(ids), "max_model_len": model.limits.context_length, "tokens": ids, "token_strs": strs}

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest):
        model.resolve(body.model)
        vocab = model.limits.vocab_size
        bad = [t for t in body.tokens if t < 0 or (vocab is not None and t >= vocab)]
        if bad:
            raise RequestError(f"token id {bad[0]} is outside the vocabulary [0, {vocab})", "tokens")
        return {"prompt": model.detokenize(body.tokens)}

    @app.get("/tokenizer_info")
    async def tokenizer_info():
        return model.tokenizer_info()


def _render(model: ServedModel, body: TokenizeChatRequest, messages: list[dict]) -> str:
    """The prompt text of the template's `messages`, as /v1/chat/completions renders them; with
    continue_final_message the last (assistant) message is left open, its text the end of the prompt."""
    if model.chat_template is None:
        raise RequestError(f"model '{model.name}' has no chat template", "messages")
    kwargs = body.chat_template_kwargs or {}
    if not body.continue_final_message:
        return model.chat_template.render(messages, body.add_generation_prompt, **kwargs)
    last = messages[-1]["content"]
    if not isinstance(last, str):  # a content list the template renders itself: its text parts
        last = "".join(p.get("text", "") for p in last if p.get("type") == "text")
    text = model.chat_template.render(messages, False, **kwargs)
    cut = text.rfind(last) if last else -1
    return text[: cut + len(last)] if cut >= 0 else text

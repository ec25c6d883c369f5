"""The ASGI app: OpenAI-compatible endpoints over one engine, plus vLLM's tokenizer endpoints, /health and /metrics.

POST /v1/completions, POST /v1/chat/completions   (stream: true -> server-sent events ending in [DONE])
GET  /v1/models, /v1/models/{id}, /version, /health, /metrics
POST /tokenize, /detokenize; GET /tokenizer_info  (ovbuild.serve.tokenize)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from ovbuild.errors import RequestError
from ovbuild.runtime.images import ImagePrompt
from ovbuild.runtime.prompts import prompt_list
from ovbuild.serve.choices import Choice, spec_decode_stats
from ovbuild.serve.engine import Engine, Event, Ticket
from ovbuild.serve.errors import install_error_handlers
from ovbuild.serve.model import ServedModel
from ovbuild.serve.protocol import (
    ChatCompletionRequest,
    ChatFormat,
    CompletionFormat,
    CompletionRequest,
    Format,
    SamplingFields,
    chat_messages_with_images,
    error_body,
    generation_config,
)
from ovbuild.serve.structured import chat_structure, one_constraint, requested_constraints, structured_fields
from ovbuild.serve.tokenize import add_tokenizer_routes
from ovbuild.serve.tools import check_template_tools, check_tools
from ovbuild.version import __version__

__all__ = ["ServedModel", "create_app"]

# How often a non-streaming request checks whether its client is still there, events arriving or not.
_DISCONNECT_POLL_S = 0.25


def create_app(engine: Engine, model: ServedModel) -> FastAPI:
    """The app; it starts the engine thread on startup and stops it on shutdown."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        if not engine.alive:
            engine.start()
        yield
        engine.stop()

    app = FastAPI(title="ovbuild serve", lifespan=lifespan)
    app.state.engine, app.state.model = engine, model
    install_error_handlers(app)
    add_tokenizer_routes(app, model)

    @app.get("/health")
    async def health():
        stats = engine.stats
        ok = engine.alive
        body = {"status": "ok" if ok else "engine stopped", **stats.__dict__}
        return JSONResponse(body, status_code=200 if ok else 503)

    @app.get("/metrics")
    async def metrics():
        body, content_type = engine.metrics.exposition()
        return Response(body, media_type=content_type)

    @app.get("/version")
    async def version():
        return {"version": __version__}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [model.card(name) for name in model.names]}

    @app.get("/v1/models/{model_id:path}")
    async def retrieve_model(model_id: str):
        return model.card(model.resolve(model_id))

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        name = model.resolve(body.model)
        prompts, _ = prompt_list(body.prompt)
        ids = [model.encode(p) if isinstance(p, str) else p for p in prompts]
        if model.images is not None:
            model.images.refuse_placeholders(ids)
        echo = [p if isinstance(p, str) else model.decode(p) for p in prompts] if body.echo else None
        fmt = CompletionFormat(name, model.token_text)
        structured = await structured_fields(model, body, one_constraint(requested_constraints(body)))
        return await _serve(engine, model, body, ids, fmt, request, 16, echo, structured)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        name = model.resolve(body.model)
        if model.chat_template is None:
            raise RequestError(f"model '{model.name}' has no chat template: use /v1/completions", "messages")
        tools = check_tools(body.tools, body.tool_choice)
        check_template_tools(tools, model.chat_template.renders_tools, model.name)
        kwargs = dict(body.chat_template_kwargs or {})
        if tools is not None and tools.choice != "none":
            kwargs["tools"] = tools.template_tools
        messages, shown = chat_messages_with_images(body, model.images)
        text = model.chat_template.render(messages, body.add_generation_prompt, **kwargs)
        ids, pictures = await _chat_prompt(model, text, shown)
        parsing, constraint = chat_structure(model, body, tools, text)
        structured = await structured_fields(model, body, constraint)
        fmt = ChatFormat(name, model.token_text, parsing)
        return await _serve(
            engine, model, body, [ids], fmt, request, model.default_max_tokens, None, structured, [pictures]
        )

    return app


async def _chat_prompt(model: ServedModel, text: str, shown: list[tuple[str, str]]):
    """A rendered chat's token ids and the images it shows (None without images). Images are read, processed and
    encoded in a worker thread, so the event loop and the engine's steps go on meanwhile."""
    images = model.images
    if not shown:
        if images is not None and images.image_token in text:
            raise RequestError(
                f"the messages hold the image token {images.image_token} but no image_url part: there is no image "
                f"for it",
                "messages",
            )
        return model.encode(text), None
    return await run_in_threadpool(images.prepare, text, shown, model.limits)


async def _serve(
    engine: Engine,
    model: ServedModel,
    body: SamplingFields,
    ids: list[list[int]],
    fmt: Format,
    request: Request,
    default_max_tokens: int,
    echo: list[str] | None = None,
    structured: dict | None = None,
    shown: list[ImagePrompt | None] | None = None,
) -> Response:
    """Submit every prompt (n samples of each, choice p * n + i the i-th of prompt p; submitted together, they are
    admitted together and share the prompt's cached blocks), wait until the scheduler accepted them all (or refused
    one: 400), then answer. `shown`: per prompt, the images it shows (encoded already)."""
    configs, prompts, choices, images = [], [], [], []
    shown = shown or [None] * len(ids)
    for p, prompt in enumerate(ids):
        model.limits.check_ids(prompt)
        for i in range(body.n):
            config = generation_config(
                body, len(prompt), model.base_config, model.limits, default_max_tokens, i, structured
            )
            configs.append(config)
            prompts.append(prompt)
            images.append(shown[p])
            logprobs = config.logprobs is not None
            choices.append(Choice(prompt, echo and echo[p], body.max_tokens == 0, i == 0, logprobs))
    if len(prompts) > engine.max_requests:  # no wait would ever make room: not a 503
        raise RequestError(
            f"{len(ids)} prompts x n = {body.n} are {len(prompts)} choices; this server holds at most "
            f"{engine.max_requests} at once (--max-requests)",
            "n" if body.n > 1 else "prompt",
        )
    loop, events = asyncio.get_running_loop(), asyncio.Queue()
    tickets = engine.submit(prompts, configs, [_sink(loop, events, i) for i in range(len(prompts))], images)
    pending: list[tuple[int, Event]] = []
    try:
        accepted = 0
        while accepted < len(tickets):
            index, event = await events.get()
            if event.error is not None:
                raise event.error
            accepted += event.accepted
            if not event.accepted:
                pending.append((index, event))
    except BaseException:
        _cancel(tickets)
        raise
    stats = model.spec_decode_stats != "none"
    if body.stream:
        stream = _stream(events, pending, tickets, choices, fmt, body.include_usage, stats)
        return StreamingResponse(stream, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    return await _collect(events, pending, tickets, choices, fmt, request, stats)


def _sink(loop: asyncio.AbstractEventLoop, events: asyncio.Queue, index: int) -> Callable[[Event], None]:
    """Hands the engine thread's events to the request's event loop."""

    def put(event: Event) -> None:
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody is listening any more
            loop.call_soon_threadsafe(events.put_nowait, (index, event))

    return put


def _cancel(tickets: list[Ticket]) -> None:
    for ticket in tickets:
        ticket.cancel()


async def _next(events: asyncio.Queue, pending: list) -> tuple[int, Event]:
    """The next event of the request's prompts (those read while waiting for acceptance first); errors raise."""
    index, event = pending.pop(0) if pending else await events.get()
    if event.error is not None:
        raise event.error
    return index, event


async def _stream(
    events, pending, tickets, choices: list[Choice], fmt: Format, include_usage: bool, stats: bool
) -> AsyncIterator[str]:
    """Server-sent events; a client that goes away cancels the generator, and the finally aborts its requests. With
    `stats`, a choice's last chunk carries its speculative decoding stats (as vLLM's terminal chunk does)."""
    finished = False
    try:
        for chunk in fmt.opening_chunks(len(tickets)):
            yield _sse(chunk)
        done = prompt_tokens = completion_tokens = 0
        while done < len(tickets):
            index, event = await _next(events, pending)
            choice = choices[index]
            text, scored, offset = choice.piece(event)
            if text or scored or event.last:
                chunk = fmt.chunk(index, text, choice.finish_reason(event), scored, offset)
                if stats and event.last:
                    chunk["choices"][0]["speculative_decoding_stats"] = spec_decode_stats(choice.metrics)
                yield _sse(chunk)
            done += event.last
            prompts, completions = choice.usage(event)
            prompt_tokens += prompts
            completion_tokens += completions
        if include_usage:
            yield _sse(fmt.usage_chunk(prompt_tokens, completion_tokens))
        finished = True
        yield "data: [DONE]\n\n"
    except Exception as e:  # the headers are sent: report in-band, as OpenAI does
        yield _sse(error_body(str(e), "server_error"))
    finally:
        if not finished:
            _cancel(tickets)


async def _collect(
    events, pending, tickets, choices: list[Choice], fmt: Format, request: Request, stats: bool
) -> Response:
    """The whole answer; checks every _DISCONNECT_POLL_S for a client that left, so its requests do not run on for
    nobody. A generating request has events at every step: the check runs on the clock, not when events pause."""
    reasons = [None] * len(tickets)
    done = prompt_tokens = completion_tokens = 0
    polled = time.monotonic()
    try:
        while done < len(tickets):
            try:
                index, event = await asyncio.wait_for(_next(events, pending), _DISCONNECT_POLL_S)
            except asyncio.TimeoutError:
                index = event = None
            if time.monotonic() - polled >= _DISCONNECT_POLL_S or event is None:
                polled = time.monotonic()
                if await request.is_disconnected():
                    _cancel(tickets)
                    return Response(status_code=499)
            if event is None:
                continue
            choice = choices[index]
            choice.piece(event)
            if event.last:
                reasons[index] = choice.finish_reason(event)
                done += 1
                prompts, completions = choice.usage(event)
                prompt_tokens += prompts
                completion_tokens += completions
    except BaseException:
        _cancel(tickets)
        raise
    texts, scored = [c.text for c in choices], [c.scored for c in choices]
    answer = fmt.response(texts, reasons, prompt_tokens, completion_tokens, scored)
    if stats:
        for entry, choice in zip(answer["choices"], choices, strict=True):
            entry["speculative_decoding_stats"] = spec_decode_stats(choice.metrics)
    return JSONResponse(answer)


def _sse(data: dict) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"

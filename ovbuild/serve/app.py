"""The ASGI app: OpenAI-compatible endpoints over one engine, plus /health and /metrics.

POST /v1/completions, POST /v1/chat/completions   (stream: true -> server-sent events ending in [DONE])
GET  /v1/models, /health, /metrics
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse

from ovbuild.errors import OverloadedError, RequestError
from ovbuild.runtime.prompts import PromptLimits, prompt_list
from ovbuild.runtime.request import GenerationConfig
from ovbuild.runtime.structured.grammar import Grammars
from ovbuild.runtime.structured.spec import Constraint, check_logit_bias
from ovbuild.serve.chat import ChatTemplate
from ovbuild.serve.chat_output import ChatParsing
from ovbuild.serve.choices import Choice
from ovbuild.serve.engine import Engine, Event, Ticket
from ovbuild.serve.protocol import (
    ChatCompletionRequest,
    ChatFormat,
    CompletionFormat,
    CompletionRequest,
    Format,
    SamplingFields,
    chat_messages,
    error_body,
    generation_config,
)
from ovbuild.serve.reasoning import FORMATS as REASONING_FORMATS
from ovbuild.serve.reasoning import thinking_from_start
from ovbuild.serve.structured import one_constraint, requested_constraints
from ovbuild.serve.tools import DEFAULT_FORMAT as DEFAULT_TOOL_FORMAT
from ovbuild.serve.tools import FORMATS as TOOL_FORMATS
from ovbuild.serve.tools import Tools, check_tools, tool_constraint

# How often a non-streaming request checks whether its client is still there.
_DISCONNECT_POLL_S = 0.5


@dataclass
class ServedModel:
    """What the endpoints need besides the engine: the name, tokenizer, template, limits and defaults."""

    name: str
    encode: Callable[[str], list[int]]
    base_config: GenerationConfig
    limits: PromptLimits
    chat_template: ChatTemplate | None = None
    default_max_tokens: int = 256  # chat requests without max_tokens (completions default to 16, as OpenAI's)
    decode: Callable[[list[int]], str] | None = None  # token ids -> text (echoed prompts, logprobs' tokens)
    grammars: Grammars | None = None  # the model's grammar compiler (structured output, forced tool calls)
    vocab_size: int | None = None  # the model's vocabulary (logit_bias ids are checked against it)
    reasoning_parser: str | None = None  # a key of ovbuild.serve.reasoning.FORMATS, or None: no reasoning split
    tool_call_parser: str = DEFAULT_TOOL_FORMAT  # a key of ovbuild.serve.tools.FORMATS

    def token_text(self, token: int) -> str:
        """One token's text, as the logprobs show it."""
        return self.decode([token]) if self.decode is not None else str(token)

    @classmethod
    def from_folder(
        cls, name: str, target_dir: str | Path, pipeline, default_max_tokens: int = 256, **parsers
    ) -> ServedModel:
        """parsers: reasoning_parser, tool_call_parser."""
        return cls(
            name,
            pipeline.encode,
            GenerationConfig(eos_token_ids=pipeline.eos_token_ids),
            PromptLimits.from_pipeline(pipeline),
            ChatTemplate.from_folder(target_dir),
            default_max_tokens,
            pipeline.decode,
            pipeline.grammars,
            pipeline.target.vocab_size,
            **parsers,
        )


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

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        message = f"{'.'.join(loc) or 'body'}: {first.get('msg', 'invalid request')}"
        return _error(400, message, "invalid_request_error", loc[0] if loc else None)

    @app.exception_handler(RequestError)
    async def refused(request: Request, exc: RequestError):
        return _error(400, str(exc), "invalid_request_error", exc.param)

    @app.exception_handler(OverloadedError)
    async def overloaded(request: Request, exc: OverloadedError):
        return _error(503, str(exc), "service_unavailable_error", None, "overloaded")

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

    @app.get("/v1/models")
    async def models():
        card = {"id": model.name, "object": "model", "created": 0, "owned_by": "ovbuild"}
        return {"object": "list", "data": [card]}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        _check_model(body, model)
        prompts, _ = prompt_list(body.prompt)
        ids = [model.encode(p) if isinstance(p, str) else p for p in prompts]
        echo = [p if isinstance(p, str) else model.decode(p) for p in prompts] if body.echo else None
        fmt = CompletionFormat(model.name, model.token_text)
        structured = await structured_fields(model, body, one_constraint(requested_constraints(body)))
        return await _serve(engine, model, body, ids, fmt, request, 16, echo, structured)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        _check_model(body, model)
        if model.chat_template is None:
            raise RequestError(f"model '{model.name}' has no chat template: use /v1/completions", "messages")
        tools = check_tools(body.tools, body.tool_choice)
        kwargs = dict(body.chat_template_kwargs or {})
        if tools is not None and tools.choice != "none":
            kwargs["tools"] = tools.template_tools
        text = model.chat_template.render(chat_messages(body), body.add_generation_prompt, **kwargs)
        ids = [model.encode(text)]
        parsing, constraint = chat_structure(model, body, tools, text)
        structured = await structured_fields(model, body, constraint)
        fmt = ChatFormat(model.name, model.token_text, parsing)
        return await _serve(engine, model, body, ids, fmt, request, model.default_max_tokens, None, structured)

    return app


def chat_structure(model: ServedModel, body: ChatCompletionRequest, tools: Tools | None, prompt: str):
    """(how the answers are read, the request's one constraint): the reasoning parser (a constraint starts after the
    thinking unless the prompt closed it already), tool calls read unless tool_choice is "none", and forced calls
    (tool_choice "required" or a function) constrained to the functions' schemas."""
    reasoning = REASONING_FORMATS[model.reasoning_parser] if model.reasoning_parser else None
    after = reasoning.close if reasoning is not None and not prompt.rstrip().endswith(reasoning.close) else ""
    calls = TOOL_FORMATS[model.tool_call_parser] if tools is not None and tools.parsed else None
    found = requested_constraints(body)
    if calls is not None:
        forced = tool_constraint(tools, calls, after)
        if forced is not None:
            found.append(("tool_choice", forced))
    parsing = None
    if reasoning is not None or calls is not None:
        parsing = ChatParsing(reasoning, reasoning is not None and thinking_from_start(reasoning, prompt), calls)
    return parsing, one_constraint(found, after)


async def structured_fields(model: ServedModel, body: SamplingFields, constraint: Constraint | None) -> dict:
    """GenerationConfig's constraint and logit_bias, checked; the grammar compiled here, off the engine's loop and
    bounded in time (ovbuild.runtime.structured.grammar), so the engine only copies it."""
    bias = check_logit_bias(body.logit_bias, model.vocab_size)
    if constraint is not None:
        if model.grammars is None:
            raise RequestError("this server has no grammar compiler: structured output is off", "response_format")
        await asyncio.to_thread(model.grammars.compile_bounded, constraint)
    return {"constraint": constraint, "logit_bias": bias}


def _check_model(body: SamplingFields, model: ServedModel) -> None:
    if body.model is not None and body.model != model.name:
        raise RequestError(f"the model '{body.model}' is not served here (this server serves '{model.name}')", "model")


def _error(status: int, message: str, kind: str, param: str | None, code: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, kind, param, code), status_code=status)


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
) -> Response:
    """Submit every prompt (n samples of each, choice p * n + i the i-th of prompt p; submitted together, they are
    admitted together and share the prompt's cached blocks), wait until the scheduler accepted them all (or refused
    one: 400), then answer."""
    configs, prompts, choices = [], [], []
    for p, prompt in enumerate(ids):
        model.limits.check_ids(prompt)
        for i in range(body.n):
            config = generation_config(
                body, len(prompt), model.base_config, model.limits, default_max_tokens, i, structured
            )
            configs.append(config)
            prompts.append(prompt)
            logprobs = config.logprobs is not None
            choices.append(Choice(prompt, echo and echo[p], body.max_tokens == 0, i == 0, logprobs))
    loop, events = asyncio.get_running_loop(), asyncio.Queue()
    tickets = engine.submit(prompts, configs, [_sink(loop, events, i) for i in range(len(prompts))])
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
    if body.stream:
        stream = _stream(events, pending, tickets, choices, fmt, body.include_usage)
        return StreamingResponse(stream, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    return await _collect(events, pending, tickets, choices, fmt, request)


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
    events, pending, tickets, choices: list[Choice], fmt: Format, include_usage: bool
) -> AsyncIterator[str]:
    """Server-sent events; a client that goes away cancels the generator, and the finally aborts its requests."""
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
                yield _sse(fmt.chunk(index, text, choice.finish_reason(event), scored, offset))
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


async def _collect(events, pending, tickets, choices: list[Choice], fmt: Format, request: Request) -> Response:
    """The whole answer; polls for a client that left, so its requests do not run on for nobody."""
    reasons = [None] * len(tickets)
    done = prompt_tokens = completion_tokens = 0
    try:
        while done < len(tickets):
            try:
                index, event = await asyncio.wait_for(_next(events, pending), _DISCONNECT_POLL_S)
            except asyncio.TimeoutError:
                if await request.is_disconnected():
                    _cancel(tickets)
                    return Response(status_code=499)
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
    return JSONResponse(fmt.response(texts, reasons, prompt_tokens, completion_tokens, scored))


def _sse(data: dict) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"

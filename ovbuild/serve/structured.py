"""A request's structured-output fields, as OpenAI and vLLM spell them, turned into one Constraint and a logit bias.

OpenAI: `response_format` {"type": "text" | "json_object" | "json_schema", "json_schema": {"name", "schema",
"strict"}}, `logit_bias`. vLLM: `structured_outputs` {"json" | "regex" | "choice" | "grammar" | "json_object"} and
the older `guided_json`, `guided_regex`, `guided_choice`, `guided_grammar`. At most one constraint per request; forced
tool calls (ovbuild.serve.tools) are one too. With a reasoning parser the constraint starts after the thinking.
"""

from __future__ import annotations

import asyncio

from ovbuild.errors import RequestError
from ovbuild.runtime.structured.spec import Constraint, check_logit_bias
from ovbuild.serve.chat_output import ChatParsing
from ovbuild.serve.model import ServedModel
from ovbuild.serve.reasoning import FORMATS as REASONING_FORMATS
from ovbuild.serve.reasoning import thinking_from_start
from ovbuild.serve.tools import FORMATS as TOOL_FORMATS
from ovbuild.serve.tools import Tools, tool_constraint


def requested_constraints(body) -> list[tuple[str, Constraint]]:
    """(field, constraint) for every constraint field the request sets."""
    found = []
    response_format = getattr(body, "response_format", None)
    if response_format:
        constraint = Constraint.from_response_format(response_format)
        if constraint is not None:
            found.append(("response_format", constraint))
    outputs = getattr(body, "structured_outputs", None) or {}
    if not isinstance(outputs, dict):
        raise RequestError("structured_outputs must be an object", "structured_outputs")
    for key, value in outputs.items():
        if value is None or value is False:
            continue
        found.append((f"structured_outputs.{key}", _vllm(key, value, "structured_outputs")))
    for key in ("json", "regex", "choice", "grammar"):
        value = getattr(body, f"guided_{key}", None)
        if value is not None:
            found.append((f"guided_{key}", _vllm(key, value, f"guided_{key}")))
    return found


def _vllm(key: str, value, param: str) -> Constraint:
    if key == "json":
        return Constraint.json_schema(value)
    if key == "json_object":
        return Constraint("json_object")
    if key == "choice":
        return Constraint.choice(value)
    if key in ("regex", "grammar"):
        if not isinstance(value, str) or not value:
            raise RequestError(f"{param}: a {key} is a non-empty string", param)
        return Constraint(key, value)
    raise RequestError(f"{param}: '{key}' is not one of json, regex, choice, grammar, json_object", param)


def one_constraint(found: list[tuple[str, Constraint]], after: str = "") -> Constraint | None:
    """The request's one constraint (RequestError naming the fields when there are several), starting after `after`
    (the reasoning's closing tag) when given."""
    if len(found) > 1:
        names = ", ".join(name for name, _ in found)
        raise RequestError(f"only one output constraint per request, got {names}", found[1][0].split(".")[0])
    if not found:
        return None
    constraint = found[0][1]
    return Constraint(constraint.kind, constraint.source, after) if after else constraint


def chat_structure(model: ServedModel, body, tools: Tools | None, prompt: str) -> tuple[ChatParsing | None, Constraint]:
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


async def structured_fields(model: ServedModel, body, constraint: Constraint | None) -> dict:
    """GenerationConfig's constraint and logit_bias, checked; the grammar compiled here, off the engine's loop and
    bounded in time (ovbuild.runtime.structured.grammar), so the engine only copies it."""
    bias = check_logit_bias(body.logit_bias, model.vocab_size)
    if constraint is not None:
        if model.grammars is None:
            raise RequestError("this server has no grammar compiler: structured output is off", "response_format")
        await asyncio.to_thread(model.grammars.compile_bounded, constraint)
    return {"constraint": constraint, "logit_bias": bias}

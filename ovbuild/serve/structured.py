"""A request's structured-output fields, as OpenAI and vLLM spell them, turned into one Constraint and a logit bias.

OpenAI: `response_format` {"type": "text" | "json_object" | "json_schema", "json_schema": {"name", "schema",
"strict"}}, `logit_bias`. vLLM: `structured_outputs` {"json" | "regex" | "choice" | "grammar" | "json_object"} and
the older `guided_json`, `guided_regex`, `guided_choice`, `guided_grammar`. At most one constraint per request; forced
tool calls (ovbuild.serve.tools) are one too. With a reasoning parser the constraint starts after the thinking.
"""

from __future__ import annotations

from ovbuild.errors import RequestError
from ovbuild.runtime.structured.spec import Constraint


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

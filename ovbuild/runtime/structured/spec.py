"""What a request constrains its output to, as plain data: a constraint (JSON schema, any JSON object, regex, choice,
Lark grammar), a logit bias, and where the constraint starts (after a reasoning block).

A spec is frozen and hashable, so a GenerationConfig carrying one stays a value, and compiled grammars are cached by
it (ovbuild.runtime.structured.grammar). Checks here are the ones that need no tokenizer; the grammar engine checks
the rest when it compiles.
"""

from __future__ import annotations

import json
import math
import numbers
from dataclasses import dataclass

from ovbuild.errors import GrammarError, RequestError

# kind -> what its source holds
KINDS = {
    "json_schema": "a JSON schema, serialized",
    "json_object": "nothing: any JSON object",
    "regex": "a regular expression the whole output matches",
    "choice": "a JSON list of strings, one of which is the whole output",
    "grammar": "a Lark grammar (llguidance's dialect, `start` the top rule)",
}

LOGIT_BIAS_RANGE = (-100.0, 100.0)  # OpenAI's bounds


@dataclass(frozen=True)
class Constraint:
    """One output constraint: `kind` (a key of KINDS) and its source text. `after`: the text that opens the
    constrained part (e.g. "</think>": the reasoning before it is free), "" = from the first token."""

    kind: str
    source: str = ""
    after: str = ""

    def __post_init__(self):
        if self.kind not in KINDS:
            raise GrammarError(f"constraint kind '{self.kind}' is not one of {', '.join(KINDS)}", self.kind)

    @classmethod
    def json_schema(cls, schema: dict | str | bool) -> Constraint:
        """A JSON schema given as a dict (or its JSON text)."""
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as e:
                raise GrammarError(f"the JSON schema is not JSON ({e})", "json_schema") from None
        if not isinstance(schema, (dict, bool)):
            raise GrammarError(f"a JSON schema is an object, got {type(schema).__name__}", "json_schema")
        return cls("json_schema", json.dumps(schema))  # key order kept: properties are written in it

    @classmethod
    def choice(cls, options: list[str]) -> Constraint:
        if not isinstance(options, (list, tuple)) or not options or not all(isinstance(o, str) for o in options):
            raise GrammarError("a choice is a non-empty list of strings", "choice")
        return cls("choice", json.dumps(list(options)))

    @classmethod
    def from_response_format(cls, fmt) -> Constraint | None:
        """OpenAI's response_format ({"type": "text" | "json_object" | "json_schema", "json_schema": {"name",
        "schema", "strict"}}), or a pydantic model class (its JSON schema); None for text."""
        if hasattr(fmt, "model_json_schema"):
            return cls.json_schema(fmt.model_json_schema())
        kind = fmt.get("type", "text") if isinstance(fmt, dict) else None
        if kind == "text":
            return None
        if kind == "json_object":
            return cls("json_object")
        if kind == "json_schema":
            spec = fmt.get("json_schema")
            if not isinstance(spec, dict) or "schema" not in spec:
                raise GrammarError(
                    "response_format json_schema needs {'json_schema': {'name': ..., 'schema': {...}}}",
                    "response_format",
                )
            return cls.json_schema(spec["schema"])
        raise GrammarError(
            f"response_format type {kind!r} is not one of text, json_object, json_schema", "response_format"
        )

    @property
    def param(self) -> str:
        """How a request names this constraint, for errors."""
        return {"json_schema": "json_schema", "json_object": "response_format"}.get(self.kind, self.kind)


def check_logit_bias(bias: dict | tuple | None, vocab_size: int | None = None) -> tuple[tuple[int, float], ...]:
    """OpenAI's logit_bias ({token id (as text or int): value in [-100, 100]}) as sorted (id, value) pairs; ids are
    checked against `vocab_size` when it is known. Raises RequestError naming logit_bias."""
    if not bias:
        return ()
    items = bias.items() if isinstance(bias, dict) else bias
    pairs = {}
    for key, value in items:
        try:
            token = int(key)
        except (TypeError, ValueError):
            raise RequestError(f"logit_bias: key {key!r} is not a token id", "logit_bias") from None
        if token < 0 or (vocab_size is not None and token >= vocab_size):
            limit = f" [0, {vocab_size})" if vocab_size is not None else " >= 0"
            raise RequestError(f"logit_bias: token id {token} is outside the vocabulary{limit}", "logit_bias")
        ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
        low, high = LOGIT_BIAS_RANGE
        if not ok or not low <= value <= high:
            raise RequestError(f"logit_bias[{token}] = {value!r} must lie in [{low:g}, {high:g}]", "logit_bias")
        pairs[token] = float(value)
    return tuple(sorted(pairs.items()))

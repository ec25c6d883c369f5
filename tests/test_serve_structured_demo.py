"""JSON-schema requests on the shipped demo pair (a trained model, which writes what it was trained on, code, unless a
constraint holds it): every answer, greedy and sampled, with the draft and without, parses and validates with
`jsonschema`, and the openai client's `chat.completions.parse` with a pydantic model gives a parsed instance."""

from __future__ import annotations

import json

import jsonschema
import pytest
from openai import OpenAI
from pydantic import BaseModel, Field

from ovbuild.serve.server import BackgroundServer, build_app

pytestmark = pytest.mark.slow  # end to end: `pytest -m "not slow"` leaves it out

MODEL = "demo"
SCHEMAS = {
    "record": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "size": {"type": "integer", "minimum": 0, "maximum": 99},
            "kind": {"enum": ["list", "dict", "set"]},
        },
        "required": ["name", "size", "kind"],
        "additionalProperties": False,
    },
    "nested": {
        "type": "object",
        "properties": {
            "ok": {"type": "boolean"},
            "tags": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]{1,6}$"}, "maxItems": 3},
            "point": {
                "type": "object",
                "properties": {"x": {"type": "integer", "minimum": -9, "maximum": 9}, "y": {"type": "boolean"}},
                "required": ["x", "y"],
                "additionalProperties": False,
            },
        },
        "required": ["ok", "tags", "point"],
        "additionalProperties": False,
    },
    "list": {"type": "array", "items": {"enum": [1, 2, 3, "four"]}, "minItems": 1, "maxItems": 4},
}
PROMPTS = ["def parse(text):", "Describe the variable `items` as JSON."]
SAMPLING = [{"temperature": 0}, {"temperature": 1.0, "seed": 3}, {"temperature": 0.7, "top_p": 0.9, "seed": 11}]


class Signature(BaseModel):
    name: str = Field(max_length=16)
    arguments: int = Field(ge=0, le=9)
    returns_value: bool


@pytest.fixture(scope="module", params=["draft", "alone"])
def client(request, demo_pair):
    target, draft = demo_pair
    app = build_app(target, draft if request.param == "draft" else None, name=MODEL)
    with BackgroundServer(app) as s:
        yield OpenAI(base_url=f"{s.url}/v1", api_key="unused", max_retries=0, timeout=120)


def test_every_json_schema_answer_validates(client):
    answers = 0
    for name, schema in SCHEMAS.items():
        for prompt in PROMPTS:
            for sampling in SAMPLING:
                fmt = {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}
                choice = client.chat.completions.create(
                    model=MODEL,
                    messages=[{"role": "user", "content": prompt}],
                    response_format=fmt,
                    max_tokens=160,
                    **sampling,
                ).choices[0]
                assert choice.finish_reason == "stop", (name, prompt, sampling, choice.message.content)
                jsonschema.validate(json.loads(choice.message.content), schema)
                answers += 1
    assert answers == len(SCHEMAS) * len(PROMPTS) * len(SAMPLING)


@pytest.mark.parametrize("sampling", SAMPLING[:2], ids=["greedy", "sampled"])
def test_parse_with_a_pydantic_model(client, sampling):
    completion = client.chat.completions.parse(
        model=MODEL,
        messages=[{"role": "user", "content": "def area(width, height):"}],
        response_format=Signature,
        max_tokens=160,
        **sampling,
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "stop", choice
    assert isinstance(choice.message.parsed, Signature), choice.message.content

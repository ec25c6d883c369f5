"""Structured output, tools and reasoning through the openai client against `ovbuild serve` on the tiny pair with its
draft: `chat.completions.parse` with a pydantic model, every constraint field as OpenAI and vLLM spell them, logit
bias, tool calls forced and parsed (whole and streamed, and sent back through the template), the reasoning split, and
a 400 in OpenAI's shape naming what is wrong for each kind of bad input, with the server serving on afterwards."""

from __future__ import annotations

import json
import re
import shutil

import httpx
import jsonschema
import pytest
from openai import OpenAI
from pydantic import BaseModel

from ovbuild.runtime.pipeline import EXACT_TARGET, ModelOptions, RuntimeOptions
from ovbuild.serve.server import BackgroundServer, build_app
from ovbuild.testing import TINY_TARGET

pytestmark = pytest.mark.slow  # end to end: `pytest -m "not slow"` leaves it out

MODEL = "tiny"
F32_TARGET = RuntimeOptions(target=ModelOptions("f32", None, EXACT_TARGET.cache_mb))
USER = [{"role": "user", "content": "Give me the weather."}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "pattern": "^[a-z]{1,8}$"}, "days": {"enum": [1, 2, 3]}},
            "required": ["city", "days"],
            "additionalProperties": False,
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}


class Answer(BaseModel):
    ok: bool
    count: int


@pytest.fixture(scope="module")
def server(tiny_pair):
    with BackgroundServer(build_app(*tiny_pair, F32_TARGET, name=MODEL)) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)


def test_parse_with_a_pydantic_model(client):
    completion = client.chat.completions.parse(
        model=MODEL, messages=USER, response_format=Answer, max_tokens=64, extra_body={"num_assistant_tokens": 3}
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "stop", choice
    assert isinstance(choice.message.parsed, Answer), choice.message.content


@pytest.mark.parametrize(
    ("fields", "check"),
    [
        ({"response_format": {"type": "json_object"}}, lambda t: isinstance(json.loads(t), dict)),
        ({"structured_outputs": {"regex": "[a-z]{4}[0-9]"}}, lambda t: re.fullmatch("[a-z]{4}[0-9]", t)),
        ({"structured_outputs": {"choice": ["cat", "dog"]}}, lambda t: t in ("cat", "dog")),
        ({"guided_choice": ["north", "south"]}, lambda t: t in ("north", "south")),
        ({"guided_regex": "(ab|cd){1,3}!"}, lambda t: re.fullmatch("(ab|cd){1,3}!", t)),
        ({"guided_grammar": 'start: "x" p? p? "="\np: "+" "x"'}, lambda t: re.fullmatch(r"x(\+x){0,2}=", t)),
        ({"guided_json": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3}}, lambda t: json.loads(t)),
    ],
    ids=["json_object", "so_regex", "so_choice", "guided_choice", "guided_regex", "guided_grammar", "guided_json"],
)
def test_each_constraint_field(client, fields, check):
    answer = client.completions.create(model=MODEL, prompt="Say:", max_tokens=40, extra_body=fields)
    choice = answer.choices[0]
    if choice.finish_reason == "stop":
        assert check(choice.text), choice.text
    else:
        assert choice.finish_reason == "length" and "json" in str(fields), choice


def test_logit_bias_makes_a_token_the_only_one(client):
    answer = client.completions.create(model=MODEL, prompt="x", max_tokens=6, logit_bias={str(ord("q")): 100})
    assert answer.choices[0].text == "qqqqqq"


def tool_args_valid(call) -> dict:
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, WEATHER["function"]["parameters"])
    return args


@pytest.mark.parametrize("choice", [{"type": "function", "function": {"name": "get_weather"}}, "required"])
def test_forced_tool_call_whole_and_streamed(client, choice):
    args = dict(model=MODEL, messages=USER, tools=[WEATHER, TIME], tool_choice=choice, max_tokens=160)
    whole = client.chat.completions.create(**args).choices[0]
    assert whole.finish_reason == "tool_calls", whole
    calls = whole.message.tool_calls
    assert calls and all(c.type == "function" and c.id.startswith("call_") for c in calls)
    if isinstance(choice, dict):
        assert [c.function.name for c in calls] == ["get_weather"]
    for c in calls:
        if c.function.name == "get_weather":
            tool_args_valid(c)
    streamed, reason = {}, None
    for chunk in client.chat.completions.create(**args, stream=True):
        for delta in chunk.choices[0].delta.tool_calls or []:
            entry = streamed.setdefault(delta.index, {"name": "", "arguments": ""})
            entry["name"] += delta.function.name or ""
            entry["arguments"] += delta.function.arguments or ""
        reason = chunk.choices[0].finish_reason or reason
    assert reason == "tool_calls"
    assert [(e["name"], json.loads(e["arguments"])) for e in streamed.values()] == [
        (c.function.name, json.loads(c.function.arguments)) for c in calls
    ]


def test_tool_round_trip_through_the_template(client):
    named = {"type": "function", "function": {"name": "get_weather"}}
    first = client.chat.completions.create(
        model=MODEL, messages=USER, tools=[WEATHER], tool_choice=named, max_tokens=160
    ).choices[0]
    call = first.message.tool_calls[0]
    history = [
        *USER,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"sky": "clear"})},
    ]
    again = client.chat.completions.create(model=MODEL, messages=history, tools=[WEATHER], max_tokens=8)
    assert again.choices[0].finish_reason in ("stop", "length", "tool_calls")
    none = client.chat.completions.create(model=MODEL, messages=USER, tools=[WEATHER], tool_choice="none", max_tokens=8)
    assert none.choices[0].message.tool_calls is None and none.choices[0].finish_reason in ("stop", "length")


BAD = [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}}}, "strin"),
    ({"guided_json": {"type": "object", "dependentSchemas": {"a": {}}}}, "dependentSchemas"),
    ({"guided_regex": "a("}, "invalid regex"),
    ({"guided_grammar": "start: ::"}, "invalid grammar"),
    ({"response_format": {"type": "yaml"}}, "response_format type"),
    ({"guided_regex": "a", "guided_choice": ["b"]}, "only one output constraint"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": 3}}]}, "JSON schema object"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "not among the tools"),
    ({"logit_bias": {str(TINY_TARGET["vocab_size"]): 1}}, "outside the vocabulary"),
    ({"logit_bias": {"5": 150}}, r"\[-100, 100\]"),
]


@pytest.mark.parametrize(("fields", "words"), BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_input_is_a_400_naming_it(server, fields, words):
    body = {"model": MODEL, "messages": USER, "max_tokens": 4, **fields}
    reply = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert re.search(words, error["message"]) and error["type"] == "invalid_request_error", error
    ok = httpx.post(f"{server.url}/v1/chat/completions", json={"model": MODEL, "messages": USER, "max_tokens": 2})
    assert ok.status_code == 200


@pytest.fixture(scope="module")
def thinking_server(tiny_pair, tmp_path_factory):
    """The tiny pair behind a thinking model's template, whose generation prompt opens <think> (as Qwen3 thinking
    models' do), served with the qwen3 reasoning parser."""
    target = tmp_path_factory.mktemp("thinking") / "target"
    shutil.copytree(tiny_pair[0], target)
    config = json.loads((target / "tokenizer_config.json").read_text())
    config["chat_template"] = config["chat_template"].replace(
        "assistant\\n' }}{%- endif %}", "assistant\\n<think>\\n' }}{%- endif %}"
    )
    assert "<think>" in config["chat_template"]
    (target / "tokenizer_config.json").write_text(json.dumps(config))
    app = build_app(target, tiny_pair[1], F32_TARGET, name=MODEL, reasoning_parser="qwen3")
    with BackgroundServer(app) as s:
        yield s


def test_reasoning_goes_to_reasoning_content_whole_and_streamed(thinking_server):
    client = OpenAI(base_url=f"{thinking_server.url}/v1", api_key="unused", max_retries=0, timeout=120)
    args = dict(model=MODEL, messages=USER, max_tokens=24, extra_body={"ignore_eos": True})
    whole = client.chat.completions.create(**args).choices[0].message
    reasoning = whole.model_extra.get("reasoning_content")
    assert reasoning, whole  # the random model never closes the block: all of it is thinking
    streamed = ""
    for chunk in client.chat.completions.create(**args, stream=True):
        streamed += (chunk.choices[0].delta.model_extra or {}).get("reasoning_content") or ""
        assert not chunk.choices[0].delta.content
    assert streamed == reasoning

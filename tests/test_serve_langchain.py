"""LangChain's ChatOpenAI against `ovbuild serve`: `with_structured_output(PydanticModel)` by its default method (in
langchain-openai 1.8, ChatOpenAI's default is json_schema: a `response_format` of type json_schema, checked on the
request that went out) and by json_schema and function_calling, and `bind_tools` with a call parsed back into
`AIMessage.tool_calls` and a ToolMessage round trip to a final answer; on the tiny pair (a ChatML template that renders
tools) and on the shipped demo pair, whose plain template does not read `tools`: there tool_choice "auto" is a 400
naming that, and forced calls, structured output and the round trip work."""

from __future__ import annotations

import json
from typing import Literal

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, ConfigDict, Field

langchain_openai = pytest.importorskip("langchain_openai", reason="LangChain's client: pip install 'ovbuild[test]'")
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage  # noqa: E402

from ovbuild.runtime.pipeline import EXACT_TARGET, ModelOptions, RuntimeOptions  # noqa: E402
from ovbuild.serve.server import BackgroundServer, build_app  # noqa: E402

pytestmark = pytest.mark.slow  # end to end: `pytest -m "not slow"` leaves it out

F32_TARGET = RuntimeOptions(target=ModelOptions("f32", None, EXACT_TARGET.cache_mb))
QUESTION = "What is the weather in Paris for two days?"


class Answer(BaseModel):
    ok: bool
    count: int = Field(ge=0, le=999)


class get_weather(BaseModel):  # a tool is named after its class
    """The weather in a city for a number of days."""

    model_config = ConfigDict(extra="forbid")  # additionalProperties: false, or the model may add keys
    city: str = Field(pattern="^[a-z]{1,8}$")  # bounded, so that the tiny random model's call ends
    days: Literal[1, 2, 3]


def weather(city: str, days: int) -> str:
    return f"sunny in {city} for {days} days"


WEATHER_ARGS = get_weather.model_json_schema()


@pytest.fixture(scope="module", params=["tiny", "demo"])
def served(request, tiny_pair, demo_pair):
    """(model name, server url, whether its template renders tools): the tiny pair (f32 target cache) and the demo
    pair, each with its draft."""
    name = request.param
    pair, options = (tiny_pair, F32_TARGET) if name == "tiny" else (demo_pair, None)
    with BackgroundServer(build_app(*pair, options, name=name)) as s:
        yield name, s.url, name == "tiny"


class Recorded:
    """The JSON bodies of the requests a client sent (an httpx event hook)."""

    def __init__(self):
        self.bodies: list[dict] = []

    def __call__(self, request: httpx.Request) -> None:
        self.bodies.append(json.loads(request.read()))


def chat(served, recorded: Recorded | None = None, **kw):
    name, url, _ = served
    hooks = {"request": [recorded]} if recorded is not None else {}
    return langchain_openai.ChatOpenAI(
        base_url=f"{url}/v1",
        api_key="unused",
        model=name,
        temperature=0,
        max_tokens=160,  # a call is some 100 tokens of the tiny byte-level tokenizer
        max_retries=0,
        timeout=120,
        http_client=httpx.Client(event_hooks=hooks, timeout=120),
        **kw,
    )


def test_structured_output_by_its_default_method_is_a_json_schema_response_format(served):
    recorded = Recorded()
    answer = chat(served, recorded).with_structured_output(Answer).invoke(QUESTION)
    assert isinstance(answer, Answer), answer
    (body,) = recorded.bodies
    assert body["response_format"]["type"] == "json_schema", body
    jsonschema.validate(answer.model_dump(), body["response_format"]["json_schema"]["schema"])


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_structured_output_by_each_method(served, method):
    recorded = Recorded()
    result = chat(served, recorded).with_structured_output(Answer, method=method, include_raw=True).invoke(QUESTION)
    assert result["parsing_error"] is None and isinstance(result["parsed"], Answer), result
    (body,) = recorded.bodies
    if method == "function_calling":  # a forced call of the schema as a tool
        assert body["tool_choice"]["function"]["name"] == "Answer", body
        assert [c["name"] for c in result["raw"].tool_calls] == ["Answer"]
    else:
        assert body["response_format"]["type"] == "json_schema", body


def test_bind_tools_a_call_then_a_tool_message_round_trip(served):
    _, _, renders_tools = served
    recorded = Recorded()
    llm = chat(served, recorded)
    ai = llm.bind_tools([get_weather], tool_choice="get_weather").invoke(QUESTION)
    assert isinstance(ai, AIMessage) and ai.response_metadata["finish_reason"] == "tool_calls", ai
    (call,) = ai.tool_calls
    assert call["name"] == "get_weather" and call["id"].startswith("call_"), call
    jsonschema.validate(call["args"], WEATHER_ARGS)
    history = [HumanMessage(QUESTION), ai, ToolMessage(weather(**call["args"]), tool_call_id=call["id"])]
    # the final answer: with the tools offered again (tool_choice auto) where the template renders them
    final = (llm.bind_tools([get_weather]) if renders_tools else llm).invoke(history)
    assert isinstance(final.content, str) and final.response_metadata["finish_reason"] in ("stop", "length"), final
    sent = recorded.bodies[-1]["messages"]
    assert sent[1]["tool_calls"][0]["id"] == call["id"] and sent[2] == {
        "role": "tool",
        "content": weather(**call["args"]),
        "tool_call_id": call["id"],
    }, sent


def test_tool_choice_auto_under_a_template_without_tools(served):
    """Served where the template renders tools; a 400 naming the template where it does not read them."""
    name, _, renders_tools = served
    llm = chat(served).bind_tools([get_weather])
    if renders_tools:
        ai = llm.invoke(QUESTION)
        assert ai.response_metadata["finish_reason"] in ("stop", "length", "tool_calls"), ai
        return
    with pytest.raises(openai.BadRequestError, match=f"chat template of model '{name}' does not render tools"):
        llm.invoke(QUESTION)

"""Tool-call and reasoning parsers on their own: whole answers and the same answers streamed in every split, the
checks of tools and tool_choice, and the grammar that forces a call accepting exactly the calls it should."""

from __future__ import annotations

import json

import pytest

from ovbuild.errors import RequestError
from ovbuild.runtime.structured.grammar import Grammars, start_constraint
from ovbuild.serve.reasoning import FORMATS as REASONING
from ovbuild.serve.reasoning import ReasoningStream, split_reasoning
from ovbuild.serve.tools import FORMATS, ToolCallStream, check_tools, parse_tool_calls, tool_constraint
from ovbuild.testing.tokenizer import EOS_ID, write_tokenizer

HERMES, QWEN3 = FORMATS["hermes"], REASONING["qwen3"]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'


def splits(text: str):
    """The text cut in two at every place, and one character at a time."""
    yield from ([text[:i], text[i:]] for i in range(len(text) + 1))
    yield list(text)


def streamed_calls(pieces: list[str]) -> tuple[str, list[dict]]:
    stream, content, calls = ToolCallStream(HERMES), "", []
    for i, piece in enumerate(pieces):
        text, deltas = stream.feed(piece, last=i == len(pieces) - 1)
        content += text
        calls += deltas
    return content, calls


def test_calls_parsed_whole_and_streamed_alike():
    text = "Let me look. " + CALL + "\n" + CALL.replace("Oslo", "Bergen")
    content, calls = parse_tool_calls(text, HERMES)
    assert content == "Let me look." and [json.loads(c.arguments)["city"] for c in calls] == ["Oslo", "Bergen"]
    assert all(c.name == "get_weather" and c.id.startswith("call_") for c in calls)
    for pieces in splits(text):
        got, deltas = streamed_calls(pieces)
        assert got.strip() == "Let me look." and [d["index"] for d in deltas] == [0, 1], pieces
        assert [json.loads(d["function"]["arguments"]) for d in deltas] == [{"city": "Oslo"}, {"city": "Bergen"}]


def test_text_that_only_looks_like_a_call_stays_content():
    for text in ["a < b <tool", "<tool_call>not json</tool_call> ok", "x <tool_calls"]:
        assert parse_tool_calls(text, HERMES) == (text, [])
        for pieces in splits(text):
            assert streamed_calls(pieces) == (text, []), pieces


def test_reasoning_split_whole_and_streamed():
    cases = [
        ("<think>\nplan\n</think>\n\nanswer", False, ("plan", "answer")),
        ("plan</think>answer", True, ("plan", "answer")),  # the prompt opened the block
        ("just an answer", False, (None, "just an answer")),
        ("<think>cut while thin", False, ("cut while thin", "")),
    ]
    for text, opened, expected in cases:
        assert split_reasoning(text, QWEN3, opened) == expected
        for pieces in splits(text):
            stream, reasoning, content = ReasoningStream(QWEN3, opened), "", ""
            for i, piece in enumerate(pieces):
                r, c = stream.feed(piece, last=i == len(pieces) - 1)
                reasoning, content = reasoning + r, content + c
            assert (reasoning or None, content) == (expected[0] or None, expected[1]), (text, pieces)


@pytest.mark.parametrize(
    ("tools", "choice", "words"),
    [
        ([{"type": "retrieval"}], None, "type 'function'"),
        ([{"type": "function", "function": {"name": "bad name"}}], None, "function name"),
        ([{"type": "function", "function": {"name": "f", "parameters": [1]}}], None, "JSON schema object"),
        ([WEATHER, WEATHER], None, "declared twice"),
        ([WEATHER], {"type": "function", "function": {"name": "nope"}}, "'nope', which is not among the tools"),
        ([WEATHER], "sometimes", "tool_choice must be"),
        (None, "required", "tool_choice needs tools"),
    ],
)
def test_bad_tools_refused_by_name(tools, choice, words):
    with pytest.raises(RequestError, match=words):
        check_tools(tools, choice)


def test_forced_call_grammar(tmp_path):
    write_tokenizer(tmp_path)
    grammars = Grammars(tmp_path / "tokenizer.json", (EOS_ID,), 258)
    named = tool_constraint(check_tools([WEATHER], {"type": "function", "function": {"name": "get_weather"}}), HERMES)
    assert tool_constraint(check_tools([WEATHER], "auto"), HERMES) is None
    good = list(CALL.encode())
    state = start_constraint(grammars, named, ())
    assert state.advance(good)[0] == good and state.matcher.is_accepting(), "the grammar refuses a correct call"
    for wrong in [CALL.replace('"Oslo"', "1"), CALL.replace("get_weather", "get_time"), "Sure! " + CALL]:
        state = start_constraint(grammars, named, ())
        kept, _ = state.advance(list(wrong.encode()))
        assert len(kept) < len(wrong.encode()), f"the grammar accepts {wrong!r}"

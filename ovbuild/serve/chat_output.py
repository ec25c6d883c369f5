"""A chat answer's text read for its parts: the reasoning (`reasoning_content`), the tool calls (`tool_calls`, and
finish_reason "tool_calls"), and the content, whole or as stream deltas, with the parsers the server and the request
chose (ovbuild.serve.reasoning, ovbuild.serve.tools)."""

from __future__ import annotations

from dataclasses import dataclass

from ovbuild.serve.reasoning import ReasoningFormat, ReasoningStream, split_reasoning
from ovbuild.serve.tools import ToolCallFormat, ToolCallStream, parse_tool_calls


@dataclass(frozen=True)
class ChatParsing:
    """How to read one request's answers: a reasoning format (None: none), whether the prompt opened the reasoning
    block, and a tool-call format (None: calls are not read)."""

    reasoning: ReasoningFormat | None = None
    opened: bool = False
    tools: ToolCallFormat | None = None

    def message(self, text: str) -> tuple[dict, bool]:
        """(the assistant message of a whole answer, whether it called tools)."""
        message: dict = {"role": "assistant"}
        if self.reasoning is not None:
            message["reasoning_content"], text = split_reasoning(text, self.reasoning, self.opened)
        calls = []
        if self.tools is not None:
            text, calls = parse_tool_calls(text, self.tools)
        message["content"] = text if text or not calls else None
        if calls:
            message["tool_calls"] = [c.as_openai() for c in calls]
        return message, bool(calls)

    def stream(self) -> ChatStream:
        return ChatStream(self)


class ChatStream:
    """One choice's stream: each text delta becomes a delta of content, reasoning_content and tool_calls."""

    def __init__(self, parsing: ChatParsing):
        self.reasoning = ReasoningStream(parsing.reasoning, parsing.opened) if parsing.reasoning else None
        self.tools = ToolCallStream(parsing.tools) if parsing.tools else None

    @property
    def called(self) -> bool:
        return self.tools is not None and self.tools.calls > 0

    def feed(self, text: str, last: bool) -> dict:
        delta = {}
        if self.reasoning is not None:
            thought, text = self.reasoning.feed(text, last)
            if thought:
                delta["reasoning_content"] = thought
        if self.tools is not None:
            text, calls = self.tools.feed(text, last)
            if calls:
                delta["tool_calls"] = calls
        if text:
            delta["content"] = text
        return delta

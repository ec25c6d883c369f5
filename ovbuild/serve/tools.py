"""Tool calls: the request's `tools` and `tool_choice` checked, the grammar that forces a call, and the model's calls
parsed out of its text into OpenAI's `tool_calls` (whole, or as stream deltas).

Formats are a table, one entry per way a model family writes a call; a chat template renders the tools and the
history, the format says how to read the answer. Hermes / Qwen2.5 / Qwen3 write each call as
`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

from ovbuild.errors import RequestError
from ovbuild.runtime.structured.spec import Constraint


@dataclass(frozen=True)
class ToolCallFormat:
    """How a model family writes a call: the text around it, and its body a JSON {"name", "arguments"}."""

    name: str
    open: str
    close: str


FORMATS = {"hermes": ToolCallFormat("hermes", "<tool_call>", "</tool_call>")}  # Hermes 2 Pro, Qwen2.5, Qwen3
DEFAULT_FORMAT = "hermes"

_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")  # OpenAI's function names
# the JSON of a forced call, as structured output writes JSON (ovbuild.runtime.structured.grammar.JSON_OPTIONS)
_JSON_STYLE = {"whitespace_flexible": False, "whitespace_pattern": "[ ]?"}


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # JSON text, as OpenAI sends it
    id: str = ""

    def as_openai(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class Tools:
    """A request's checked tools: their function schemas by name, and what tool_choice asks for ("none", "auto",
    "required", or a function name)."""

    functions: dict[str, dict]
    choice: str
    template_tools: list[dict]

    @property
    def parsed(self) -> bool:
        """Whether the answer is read for calls."""
        return bool(self.functions) and self.choice != "none"


def check_template_tools(tools: Tools | None, renders_tools: bool, model: str) -> None:
    """Refuse tool_choice "auto" under a chat template that never reads `tools`: the model would not see them, and
    nothing would make it call one. A forced call is served (the constraint writes it whatever the prompt shows)."""
    if tools is not None and tools.choice == "auto" and not renders_tools:
        raise RequestError(
            f"the chat template of model '{model}' does not render tools (it never reads `tools`), so the model "
            "would not see them: force a call with tool_choice 'required' or a named function, or send no tools",
            "tools",
        )


def check_tools(tools: list | None, tool_choice) -> Tools | None:
    """The request's tools and tool_choice, checked (RequestError naming the field); None without tools."""
    if tool_choice is not None and not tools:
        if tool_choice in ("none", "auto"):
            return None
        raise RequestError("tool_choice needs tools", "tool_choice")
    if not tools:
        return None
    if not isinstance(tools, list):
        raise RequestError("tools must be a list of {type: function, function: {...}}", "tools")
    functions = {}
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type", "function") != "function":
            raise RequestError(f"tools[{i}]: only tools of type 'function' are supported", "tools")
        function = tool.get("function")
        if not isinstance(function, dict):
            raise RequestError(f"tools[{i}]: 'function' must be an object with a name", "tools")
        name = function.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise RequestError(f"tools[{i}]: function name {name!r} must be 1-64 of a-z, A-Z, 0-9, _ . -", "tools")
        if name in functions:
            raise RequestError(f"tools[{i}]: function '{name}' is declared twice", "tools")
        parameters = function.get("parameters", {"type": "object"})
        if not isinstance(parameters, dict):
            raise RequestError(f"tools[{i}]: function '{name}' parameters must be a JSON schema object", "tools")
        functions[name] = parameters
    return Tools(functions, _choice(tool_choice, functions), tools)


def _choice(tool_choice, functions: dict) -> str:
    if tool_choice is None:
        return "auto"
    if tool_choice in ("none", "auto", "required"):
        return tool_choice
    if isinstance(tool_choice, dict) and isinstance(tool_choice.get("function"), dict):
        name = tool_choice["function"].get("name")
        if name not in functions:
            raise RequestError(f"tool_choice names the function {name!r}, which is not among the tools", "tool_choice")
        return name
    raise RequestError(
        "tool_choice must be 'none', 'auto', 'required' or {type: function, function: {name}}", "tool_choice"
    )


def call_schema(name: str, parameters: dict) -> dict:
    """The JSON schema of one call's body in the Hermes format."""
    return {
        "type": "object",
        "properties": {"name": {"const": name}, "arguments": parameters},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def tool_constraint(tools: Tools, fmt: ToolCallFormat, after: str = "") -> Constraint | None:
    """The grammar forcing calls: one or more calls to any tool ("required"), or one call to the named function;
    None when the model may answer in text ("auto", "none")."""
    if tools.choice in ("auto", "none"):
        return None
    if tools.choice == "required":
        bodies = [call_schema(n, p) for n, p in tools.functions.items()]
        schema, repeat = ({"anyOf": bodies} if len(bodies) > 1 else bodies[0]), "+"
    else:
        schema, repeat = call_schema(tools.choice, tools.functions[tools.choice]), ""
    schema = {**schema, "x-guidance": _JSON_STYLE}
    lark = (
        f"start: call{repeat}\n"
        f"call: {json.dumps(fmt.open + chr(10))} body {json.dumps(chr(10) + fmt.close)} {json.dumps(chr(10))}?\n"
        f"body: %json {json.dumps(schema)}\n"
    )
    return Constraint("grammar", lark, after)


def parse_tool_calls(text: str, fmt: ToolCallFormat) -> tuple[str, list[ToolCall]]:
    """(content, calls) of a whole answer: the text outside the call markers, and each well-formed call; a call
    whose body is not JSON with a name stays in the content, as the model wrote it."""
    content, calls, rest = [], [], text
    while True:
        begin = rest.find(fmt.open)
        if begin < 0:
            content.append(rest)
            break
        end = rest.find(fmt.close, begin)
        body = rest[begin + len(fmt.open) : end if end >= 0 else len(rest)]
        call = _call(body)
        if call is None:
            content.append(rest)
            break
        content.append(rest[:begin])
        calls.append(call)
        rest = rest[end + len(fmt.close) :] if end >= 0 else ""
    return "".join(content).strip() if calls else "".join(content), calls


def _call(body: str) -> ToolCall | None:
    try:
        data = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return None
    arguments = data.get("arguments", data.get("parameters", {}))
    return ToolCall(data["name"], json.dumps(arguments, ensure_ascii=False), f"call_{uuid.uuid4().hex[:24]}")


class ToolCallStream:
    """Splits a streamed answer into content deltas and whole calls: text that may start a call marker is held back
    until it is known, and a call is sent once its closing marker arrives (OpenAI's delta shape)."""

    def __init__(self, fmt: ToolCallFormat):
        self.fmt, self.buffer, self.calls = fmt, "", 0
        self.inside = False

    def feed(self, text: str, last: bool = False) -> tuple[str, list[dict]]:
        """(content delta, tool_call deltas) after `text`; `last`: the answer ended (flush what is held)."""
        self.buffer += text
        content, deltas = [], []
        while True:
            if not self.inside:
                begin = self.buffer.find(self.fmt.open)
                if begin < 0:
                    keep = 0 if last else partial_suffix(self.buffer, self.fmt.open)
                    content.append(self.buffer[: len(self.buffer) - keep])
                    self.buffer = self.buffer[len(self.buffer) - keep :]
                    break
                content.append(self.buffer[:begin] if not self.calls else self.buffer[:begin].strip())
                self.buffer, self.inside = self.buffer[begin + len(self.fmt.open) :], True
            end = self.buffer.find(self.fmt.close)
            if end < 0 and not last:
                break
            body = self.buffer[:end] if end >= 0 else self.buffer
            call = _call(body)
            self.buffer = self.buffer[end + len(self.fmt.close) :] if end >= 0 else ""
            self.inside = False
            if call is None:
                content.append(self.fmt.open + body + (self.fmt.close if end >= 0 else ""))
                continue
            deltas.append({"index": self.calls, **call.as_openai()})
            self.calls += 1
        return "".join(content), deltas


def partial_suffix(text: str, marker: str) -> int:
    """Length of the longest end of `text` that begins `marker` (held back: it may be the start of a call)."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0

"""Reasoning parsers: the thinking a model writes before its answer goes to `reasoning_content`, the rest to
`content` (vLLM's `--reasoning-parser`). One entry per format.

Qwen3 thinks inside `<think>...</think>`. Its templates either let the model open the block itself, or open it in
the prompt (thinking-only models, and the generation prompt of some templates): so the answer is read as reasoning
from its start when it begins with the opening tag or when the prompt ends with it, up to the closing tag; an answer
with neither is all content (thinking turned off).
"""

from __future__ import annotations

from dataclasses import dataclass

from ovbuild.serve.tools import partial_suffix


@dataclass(frozen=True)
class ReasoningFormat:
    name: str
    open: str
    close: str


FORMATS = {"qwen3": ReasoningFormat("qwen3", "<think>", "</think>")}


def thinking_from_start(fmt: ReasoningFormat, prompt: str) -> bool:
    """Whether the prompt left a reasoning block open (the answer starts inside it)."""
    return prompt.rstrip().endswith(fmt.open)


def split_reasoning(text: str, fmt: ReasoningFormat, opened: bool = False) -> tuple[str | None, str]:
    """(reasoning_content or None, content) of a whole answer; `opened`: the prompt opened the block."""
    stripped = text.lstrip()
    if stripped.startswith(fmt.open):
        text, opened = stripped[len(fmt.open) :], True
    if not opened:
        return None, text
    end = text.find(fmt.close)
    if end < 0:
        return text.strip("\n"), ""  # cut (max_tokens) while thinking
    return text[:end].strip("\n"), text[end + len(fmt.close) :].lstrip("\n")


class ReasoningStream:
    """Splits streamed text into (reasoning delta, content delta); held back: a possible tag split across deltas."""

    def __init__(self, fmt: ReasoningFormat, opened: bool = False):
        self.fmt, self.buffer = fmt, ""
        self.state = "inside" if opened else "start"  # start -> inside -> after, or start -> after
        self.lead = False  # the newlines after the closing tag are dropped, as in a whole answer

    def feed(self, text: str, last: bool = False) -> tuple[str, str]:
        self.buffer += text
        reasoning, content = "", ""
        if self.state == "start":
            head = self.buffer.lstrip()
            if head.startswith(self.fmt.open):
                self.buffer, self.state = head[len(self.fmt.open) :].lstrip("\n"), "inside"
            elif self.fmt.open.startswith(head) and not last:
                return "", ""  # still may be the opening tag
            else:
                self.state = "after"
        if self.state == "inside":
            end = self.buffer.find(self.fmt.close)
            if end < 0:
                keep = 0 if last else partial_suffix(self.buffer, self.fmt.close)
                reasoning, self.buffer = self.buffer[: len(self.buffer) - keep], self.buffer[len(self.buffer) - keep :]
                return reasoning, ""
            reasoning = self.buffer[:end].rstrip("\n")
            self.buffer, self.state = self.buffer[end + len(self.fmt.close) :], "after"
            self.lead = True
        if self.state == "after":
            content, self.buffer = self.buffer, ""
            if self.lead:
                content = content.lstrip("\n")
                self.lead = not content and not last
        return reasoning, content


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
    """Splits streamed text into (reasoning delta, content delta) as `split_reasoning` splits the whole; held back:
    a possible tag split across deltas, and newlines that may turn out to end the reasoning."""

    def __init__(self, fmt: ReasoningFormat, opened: bool = False):
        self.fmt, self.text, self.pos = fmt, "", 0  # pos: where the text not yet sent (nor skipped) begins
        self.state = "inside" if opened else "start"  # start -> inside -> after, or start -> after
        self.skip_newlines = opened  # at the start of the reasoning and of the content after it

    def feed(self, text: str, last: bool = False) -> tuple[str, str]:
        self.text += text
        reasoning = ""
        if self.state == "start":
            head = self.text.lstrip()
            if head.startswith(self.fmt.open):
                self.state, self.skip_newlines = "inside", True
                self.pos = len(self.text) - len(head) + len(self.fmt.open)
            elif self.fmt.open.startswith(head) and not last:
                return "", ""  # may still be the opening tag
            else:
                self.state = "after"
        if self.state == "inside":
            close = self.fmt.close
            end = self.text.find(close, max(self.pos, len(self.text) - len(text) - len(close)))
            if end < 0:
                stop = len(self.text)
                if not last:
                    stop -= partial_suffix(self.text[-len(close) :], close)
                    while stop > self.pos and self.text[stop - 1] == "\n":
                        stop -= 1
                reasoning = self._take(stop).rstrip("\n") if last else self._take(stop)
                return reasoning, ""
            reasoning = self._take(end).rstrip("\n")
            self.state, self.pos, self.skip_newlines = "after", end + len(close), True
        return reasoning, self._take(len(self.text))

    def _take(self, stop: int) -> str:
        piece, self.pos = self.text[self.pos : stop], max(stop, self.pos)
        if self.skip_newlines:
            piece = piece.lstrip("\n")
            self.skip_newlines = not piece
        return piece

"""One answer's choices as their events arrive: n samples per prompt, the echoed prompt with its logprobs, and
max_tokens 0 (echo alone: the one token run for it is left out)."""

from __future__ import annotations

from dataclasses import dataclass

from ovbuild.serve.engine import Event
from ovbuild.serve.protocol import Scored


@dataclass
class Choice:
    """What the answer has of one choice: its text so far and, when asked, its scored tokens."""

    prompt: list[int]
    echo: str | None = None  # the prompt's text, put before the completion (completions' echo)
    drop_tokens: bool = False  # max_tokens 0
    counts_prompt: bool = True  # the first sample of its prompt: its prompt tokens count in the usage once
    logprobs: bool = False
    started: bool = False
    text: str = ""
    scored: Scored | None = None

    def piece(self, event: Event) -> tuple[str, Scored | None, int]:
        """This event's share of the choice: (text, scored tokens or None, the text's offset in the choice)."""
        text = "" if self.drop_tokens else event.text
        scored = None if not self.logprobs or self.drop_tokens else [(e.token, e) for e in event.logprobs]
        if self.logprobs and scored is None:
            scored = []
        if not self.started:
            self.started = True
            if self.echo is not None:
                text = self.echo + text
                if self.logprobs:
                    prompt = list(event.prompt_logprobs or [None] * len(self.prompt))
                    scored = [*zip(self.prompt, prompt, strict=True), *scored]
        offset = len(self.text)
        self.text += text
        if scored is not None:
            self.scored = [*(self.scored or []), *scored]
        return text, scored, offset

    def usage(self, event: Event) -> tuple[int, int]:
        """(prompt tokens, completion tokens) of the choice's last event, as the answer's usage counts them."""
        return event.prompt_tokens if self.counts_prompt else 0, 0 if self.drop_tokens else event.completion_tokens

    def finish_reason(self, event: Event) -> str | None:
        return "length" if self.drop_tokens and event.finish_reason == "stop" else event.finish_reason

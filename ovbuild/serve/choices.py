"""One answer's choices as their events arrive: n samples per prompt, the echoed prompt with its logprobs, and
max_tokens 0 (echo alone: the one token run for it is left out)."""

from __future__ import annotations

from dataclasses import dataclass

from ovbuild.runtime.metrics import RequestMetrics
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
    metrics: RequestMetrics | None = None  # the request's counters, from its last event

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
        if event.last:
            self.metrics = event.metrics
        if scored is not None:
            self.scored = [*(self.scored or []), *scored]
        return text, scored, offset

    def usage(self, event: Event) -> tuple[int, int]:
        """(prompt tokens, completion tokens) of the choice's last event, as the answer's usage counts them."""
        return event.prompt_tokens if self.counts_prompt else 0, 0 if self.drop_tokens else event.completion_tokens

    def finish_reason(self, event: Event) -> str | None:
        return "length" if self.drop_tokens and event.finish_reason == "stop" else event.finish_reason


def spec_decode_stats(metrics: RequestMetrics | None) -> dict | None:
    """One choice's speculative decoding, in vLLM's per-request `speculative_decoding_stats` shape (its `summary`
    level): tokens per verification step, the share of draft tokens accepted, the steps by accepted count, and
    (ovbuild's addition) the accepted count at each draft position. None without the request's counters."""
    if metrics is None:
        return None
    return {
        "mean_acceptance_length": metrics.mean_acceptance_length,
        "draft_acceptance_rate": metrics.acceptance_rate,
        "acceptance_histogram": {str(j): c for j, c in enumerate(metrics.accepted_histogram) if c},
        "num_spec_steps": metrics.num_drafts,
        "num_accepted_draft_tokens": metrics.num_accepted_tokens,
        "num_draft_tokens": metrics.num_draft_tokens,
        # the draft length is chosen each step (or per request): the longest this request was given
        "num_spec_tokens": len(metrics.accepted_per_position),
        "num_accepted_tokens_per_pos": list(metrics.accepted_per_position),
    }

"""Text as tokens are committed: incremental detokenization, and a loop that streams every request of a scheduler."""

from __future__ import annotations

from collections.abc import Callable

from ovbuild.runtime.request import FinishReason, Request
from ovbuild.runtime.scheduler import Scheduler

# What a byte-level decoder renders for bytes that do not yet form a whole character.
_INCOMPLETE = "\ufffd"


class TextStream:
    """The new text of one request after each step. It never emits half a multi-byte character, and with stop
    strings it holds back the tail that could start one (the scheduler cuts the text before a stop string)."""

    def __init__(self, decode: Callable[[list[int]], str], stop_strings: tuple[str, ...] = ()):
        self.decode = decode
        self.holdback = max((len(s) for s in stop_strings), default=1) - 1
        self.sent = ""

    def push(self, generated: list[int]) -> str:
        """New text since the last call, given every token committed so far."""
        # Decoding the whole sequence (not a window) keeps the pieces equal to the final text for any tokenizer.
        text = self.decode(generated).rstrip(_INCOMPLETE)
        text = text[: len(text) - self.holdback]
        if len(text) <= len(self.sent) or not text.startswith(self.sent):
            return ""
        delta, self.sent = text[len(self.sent) :], text
        return delta

    def finish(self, final_text: str) -> str:
        """The rest of the request's final text (cut before a stop string, whole characters)."""
        delta = final_text[len(self.sent) :]
        self.sent = final_text
        return delta


def step_until_done(scheduler: Scheduler, after_step: Callable[[Scheduler], bool | None] | None = None) -> None:
    """The one step loop (Pipeline.generate, stream_until_done, the server's engine): step until every request has
    finished, calling after_step(scheduler) after each step (False ends the loop early, requests left as they are).
    An exception (Ctrl-C included) aborts every unfinished request before it propagates, so no block is left behind:
    an Exception as an error (FinishReason.ERROR), anything else (Ctrl-C) as an abort."""
    try:
        while scheduler.has_unfinished():
            scheduler.step()
            if after_step is not None and after_step(scheduler) is False:
                return
    except Exception:
        scheduler.abort_all(FinishReason.ERROR)
        raise
    except BaseException:
        scheduler.abort_all(FinishReason.ABORT)
        raise


def stream_until_done(
    scheduler: Scheduler,
    on_text: Callable[[Request, str, bool], bool | None],
    decode: Callable[[list[int]], str],
) -> None:
    """Step until every request has finished, calling on_text(request, new_text, finished) as text is committed
    (finished=True once, last). on_text returning True stops that request. Aborts all on an exception (Ctrl-C)."""
    streams: dict[int, TextStream] = {}
    reported: set[int] = set()

    def stream(request: Request) -> TextStream:
        if request.id not in streams:
            streams[request.id] = TextStream(decode, request.config.stop_strings)
        return streams[request.id]

    def after_step(scheduler: Scheduler) -> None:
        for request in list(scheduler.running):
            text = stream(request).push(request.generated)
            if text and on_text(request, text, False):
                scheduler.abort(request)
        for request in scheduler.finished:
            if request.id not in reported:
                reported.add(request.id)
                on_text(request, stream(request).finish(request.text), True)
                streams.pop(request.id)

    step_until_done(scheduler, after_step)

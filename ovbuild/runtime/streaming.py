"""The step loop, and streaming each request's text as its tokens are committed (ovbuild.runtime.decode.detokenizer)."""

from __future__ import annotations

from collections.abc import Callable

from ovbuild.runtime.decode.detokenizer import Detokenizer
from ovbuild.runtime.request import FinishReason, Request
from ovbuild.runtime.scheduler import Scheduler

# A stream of a request's new text is its detokenizer's (the holdback and the stop strings in one place).
TextStream = Detokenizer


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

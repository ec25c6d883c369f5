"""The engine: one thread owns the scheduler; any number of callers submit requests and receive their text.

Callers (HTTP handlers on the event loop) never touch the scheduler. They put commands in a thread-safe inbox; the
engine thread takes them between steps, so a new request joins the running batch at the next step (continuous
batching across clients) and an abort frees its cache blocks before the next step. After each step the engine
sends every request its newly committed text through the request's sink, a callable run on the engine thread.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ovbuild.errors import OvbuildError, OverloadedError
from ovbuild.runtime.decode.logprobs import TokenLogprob
from ovbuild.runtime.images import ImagePrompt
from ovbuild.runtime.metrics import RequestMetrics
from ovbuild.runtime.request import FinishReason, GenerationConfig, Request, Status
from ovbuild.runtime.scheduler import Scheduler
from ovbuild.runtime.streaming import TextStream, step_until_done
from ovbuild.serve.metrics import ServeMetrics

log = logging.getLogger("ovbuild.serve")


@dataclass(frozen=True)
class Event:
    """What a request's sink receives: `accepted` once the scheduler took it, then text deltas; the last event has
    `finish_reason` (or `error`) and the token counts."""

    text: str = ""
    accepted: bool = False
    finish_reason: str | None = None
    error: Exception | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    logprobs: tuple[TokenLogprob, ...] = ()  # of the tokens committed since the last event (when asked)
    prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None  # once, with the first event after the prompt
    metrics: RequestMetrics | None = None  # the request's own counters (its drafts and acceptance), with the last

    @property
    def last(self) -> bool:
        return self.finish_reason is not None or self.error is not None


@dataclass(eq=False)
class Ticket:
    """One submitted prompt, from the caller's side: cancel() aborts it wherever it is."""

    prompt: list[int]
    config: GenerationConfig
    sink: Callable[[Event], None]
    engine: Engine
    images: ImagePrompt | None = None  # the images its prompt shows (embeddings, positions), made before submit
    submitted: float = field(default_factory=time.perf_counter)
    request: Request | None = None  # set by the engine thread once the scheduler accepted it
    stream: TextStream | None = None
    first_token: float | None = None
    logprobs_sent: int = 0
    prompt_logprobs_sent: bool = False

    def scores(self, request: Request, end: int | None = None) -> dict:
        """The logprob fields of the next event: entries not sent yet (up to `end`), the prompt's once it is done."""
        fields = {}
        if request.config.logprobs is not None:
            end = len(request.logprobs) if end is None else end
            fields["logprobs"] = tuple(request.logprobs[self.logprobs_sent : end])
            self.logprobs_sent = max(end, self.logprobs_sent)
        done = request.generated or request.status is Status.FINISHED
        if request.config.prompt_logprobs is not None and done and not self.prompt_logprobs_sent:
            fields["prompt_logprobs"] = tuple(request.prompt_logprobs)
            self.prompt_logprobs_sent = True
        return fields

    def cancel(self) -> None:
        self.engine._inbox.put(("abort", self))


@dataclass(frozen=True)
class EngineStats:
    """A snapshot the engine thread publishes after each step, safe to read from any thread."""

    running: int = 0
    waiting: int = 0
    outstanding: int = 0
    free_blocks: dict[str, int] = field(default_factory=dict)
    total_blocks: dict[str, int] = field(default_factory=dict)
    steps: int = 0
    errors: int = 0


class Engine:
    """Runs `scheduler` on its own thread; at most `max_requests` requests (running + waiting) at once."""

    def __init__(
        self,
        scheduler: Scheduler,
        decode: Callable[[list[int]], str],
        max_requests: int = 256,
        metrics: ServeMetrics | None = None,
    ):
        self.scheduler, self.decode, self.max_requests = scheduler, decode, max_requests
        self.metrics = metrics or ServeMetrics()
        self._inbox: queue.Queue = queue.Queue()
        self._tickets: dict[int, Ticket] = {}  # scheduler request id -> ticket (engine thread only)
        self._lock = threading.Lock()
        self._outstanding = 0
        self._errors = 0
        self._error: Exception | None = None  # the last step failure, sent to the requests it failed
        self._stopping = False
        self.stats = self._snapshot()
        self._thread = threading.Thread(target=self._loop, name="ovbuild-engine", daemon=True)

    def start(self) -> Engine:
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Finish the current step, abort what is left and end the thread."""
        self._inbox.put(None)
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def submit(
        self,
        prompts: list[list[int]],
        configs: list[GenerationConfig],
        sinks: list[Callable],
        images: list[ImagePrompt | None] | None = None,
    ) -> list[Ticket]:
        """Queue prompts that belong together (one HTTP request); all or none. OverloadedError when full. `images`:
        per prompt, the images it shows (already encoded: the engine thread never processes an image)."""
        with self._lock:
            if self._outstanding + len(prompts) > self.max_requests:
                raise OverloadedError(
                    f"the server holds {self._outstanding} requests, at most {self.max_requests}: retry later"
                )
            self._outstanding += len(prompts)
        images = images or [None] * len(prompts)
        tickets = [Ticket(*t, self, i) for *t, i in zip(prompts, configs, sinks, images, strict=True)]
        for ticket in tickets:
            self._inbox.put(("submit", ticket))
        return tickets

    # -- engine thread ---------------------------------------------------------------------------------------------

    def _loop(self) -> None:
        """Wait for work, then run the step loop (ovbuild.runtime.streaming.step_until_done) until the batch is
        empty, publishing text and taking commands between steps."""
        stopping = False
        while not stopping and self._take_commands(block=True):
            try:
                step_until_done(self.scheduler, self._between_steps)
            except Exception as e:  # an inference failure must not take the server down: fail this batch
                log.exception("engine step failed; aborting the running batch")
                self._errors += 1
                self._error = e
            stopping = self._stopping
            self._publish()  # also after commands alone: an abort finishes its request without a step
        self.scheduler.abort_all(FinishReason.SHUTDOWN)
        self._publish()

    def _between_steps(self, scheduler: Scheduler) -> bool:
        """Publish the step's text, take the commands that came in; False once stop() was called."""
        self._publish()
        self._stopping = not self._take_commands(block=False)
        return not self._stopping

    def _take_commands(self, block: bool) -> bool:
        """Apply queued submits and aborts; False once stop() was called."""
        try:
            command = self._inbox.get(block=block)
        except queue.Empty:
            return True
        while True:
            if command is None:
                return False
            kind, ticket = command
            if kind == "submit":
                self._add(ticket)
            elif ticket.request is not None and ticket.request.status is not Status.FINISHED:
                self.scheduler.abort(ticket.request)
            try:
                command = self._inbox.get_nowait()
            except queue.Empty:
                return True

    def _add(self, ticket: Ticket) -> None:
        try:
            request = self.scheduler.add_request(ticket.prompt, ticket.config, images=ticket.images)
        except OvbuildError as e:
            self._end(ticket, Event(error=e))
            return
        ticket.request = request
        ticket.stream = TextStream(self.decode, ticket.config.stop_strings)
        self._tickets[request.id] = ticket
        ticket.sink(Event(accepted=True))

    def _publish(self) -> None:
        """Send each request its new text; close the finished ones; refresh the gauges."""
        now = time.perf_counter()
        for request in self.scheduler.running:
            ticket = self._tickets[request.id]
            if request.generated and ticket.first_token is None:
                ticket.first_token = now
            text = ticket.stream.push(request.generated)
            # with stop strings the logprobs wait for the last event: a stop string may still cut streamed tokens
            scores = ticket.scores(request, 0 if request.config.stop_strings else None)
            if text or any(scores.values()):
                ticket.sink(Event(text=text, **scores))
        for request in self.scheduler.finished:
            ticket = self._tickets.pop(request.id, None)
            if ticket is None:
                continue
            if request.generated and ticket.first_token is None:
                ticket.first_token = now
            if request.finish_reason is FinishReason.ERROR:  # the step loop failed: the batch gets the error
                self._end(ticket, Event(error=self._error))
                continue
            reason = _FINISH_REASONS.get(request.finish_reason, "abort")
            self.metrics.finished(request, reason, ticket.submitted, ticket.first_token, now)
            usage = dict(prompt_tokens=len(request.prompt), completion_tokens=len(request.generated))
            text = ticket.stream.finish(request.text)
            last = Event(text=text, finish_reason=reason, metrics=request.metrics, **usage, **ticket.scores(request))
            self._end(ticket, last)
        self.scheduler.finished.clear()  # a long-running server keeps no finished request
        self.stats = self._snapshot()
        self.metrics.queue(self.stats.running, self.stats.waiting)
        self.metrics.caches(self.scheduler.metrics, {k: c.usage for k, c in self.scheduler.caches.items()})

    def _end(self, ticket: Ticket, event: Event) -> None:
        with self._lock:
            self._outstanding -= 1
        ticket.sink(event)

    def _snapshot(self) -> EngineStats:
        caches = self.scheduler.caches
        return EngineStats(
            running=len(self.scheduler.running),
            waiting=len(self.scheduler.waiting),
            outstanding=self._outstanding,
            free_blocks={k: a.free_blocks for k, a in caches.items()},
            total_blocks={k: a.num_blocks for k, a in caches.items()},
            steps=self.scheduler.metrics.steps,
            errors=self._errors,
        )


# The scheduler's finish reasons as the OpenAI API names them ("abort": the client left, "shutdown", "error").
_FINISH_REASONS = {
    FinishReason.STOP: "stop",
    FinishReason.STOP_STRING: "stop",
    FinishReason.LENGTH: "length",
    FinishReason.ABORT: "abort",
    FinishReason.SHUTDOWN: "abort",
    FinishReason.GRAMMAR: "error",  # the constraint allows no token and is not complete: the answer is cut
}

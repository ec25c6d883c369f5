"""Continuous batching with speculative decoding: one target call and one draft call per step for all requests.

Each step is planned, run, then applied (the shape of vLLM's v1 scheduler; the scheduler keeps the step and the target
call's rows, ovbuild.runtime.admission the blocks, preemption and admissions, ovbuild.runtime.verification the target
call and its verification):
  1. `schedule()` returns a StepPlan: the running requests take the blocks this step's rows need (blocks on demand;
     when the pool runs out the most recently admitted running request is preempted: its blocks are freed and it
     goes back to the front of the queue, to be recomputed later with its committed tokens joined to its prompt),
     then waiting requests are admitted, each starting on the longest prefix the target's cache holds, its draft on
     what the draft's holds of it (prefix caching, ovbuild.runtime.cache.prefix, ovbuild.runtime.admission; one
     whose first block a running request is still prefilling waits for its blocks, so n samples of a prompt compute
     it once; one asking for prompt logprobs runs all its rows, in bounded chunks), and
     the target call is packed: the verification rows [anchor, d1..dk] of decoding requests (on CPU each row a
     1-row subsequence, so that it rounds as a decode step does; the plan's draft_lengths hold each k) and prompt
     chunks of prefilling ones (bounded by max_num_batched_tokens);
  2. `execute(plan)` runs the target call;
  3. `update(plan, outputs)` verifies (ovbuild.runtime.commit: greedy, the longest prefix where d_i equals the
     target's argmax, then the target's token; a sampling request through ovbuild.runtime.decode.verify, on the rows'
     logits; a request with penalties reads its rows penalized, and its greedy tokens are their host argmax; one
     asking for logprobs keeps those of its committed rows) and appends the committed tokens; the cache manager
     commits the accepted rows (registering full blocks for prefix caching, keeping a hybrid target's
     linear-attention state after the last accepted row) and the rejected rows are never committed: the next call's
     past_lens overwrites them; finished requests free their blocks;
  4. the draft side (ovbuild.runtime.draft_step) plans: a DraftPlan with the draft length of every decoding request
     (pinned by num_assistant_tokens, else by ovbuild.runtime.speculation.planner from measured call costs and each
     request's acceptance; 0 = no draft for it), chosen by a DraftPlanner that keeps its own backoff counters;
  5. `DraftStep.execute` runs that plan (it never plans): one draft call, when any request drafts, packs per request
     the target taps it has not seen and a block of the chosen length; with no request drafting there is no draft
     call and the taps wait for the next one.
While the planner has backed off all the way (drafting has not paid for a while) and no request pins a draft length,
target calls run without taps where the target can leave them out (PagedModel.can_skip_taps), and the decoding
requests leave them untaken where they are optional (PagedModel.taps_optional); a request that is to draft again
first gets the taps it missed (ovbuild.runtime.catch_up, run before the draft call).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from ovbuild.runtime.admission import Admission
from ovbuild.runtime.cache.cache_manager import CacheManager
from ovbuild.runtime.cache.rows import prompt_chunk
from ovbuild.runtime.decode.logprobs import PROMPT_LOGPROB_ROWS
from ovbuild.runtime.draft_step import DraftStep
from ovbuild.runtime.images import ImagePrompt
from ovbuild.runtime.metrics import RunMetrics
from ovbuild.runtime.model.paged_model import PagedModel
from ovbuild.runtime.request import FinishReason, GenerationConfig, Request, Status
from ovbuild.runtime.speculation.drafters.base import Drafter
from ovbuild.runtime.speculation.planner import Speculation
from ovbuild.runtime.step_plan import StepPlan, TargetRows
from ovbuild.runtime.structured.grammar import Grammars, start_constraint
from ovbuild.runtime.structured.spec import check_logit_bias
from ovbuild.runtime.validation import check_positive_int, token_ids
from ovbuild.runtime.verification import Verification

DEFAULT_MAX_NUM_SEQS = 256


class Scheduler(Admission, Verification):
    """Serves many requests at once on a paged target, with an optional drafter (None = target alone)."""

    def __init__(
        self,
        target: PagedModel,
        drafter: Drafter | None = None,
        max_num_batched_tokens: int = 2048,
        detokenize: Callable[[list[int]], str] | None = None,
        trace: bool = False,
        max_model_len: int | None = None,
        speculation: Speculation | None = None,
        *,
        enable_prefix_caching: bool = True,
        max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
        grammars: Grammars | None = None,
    ):
        """max_model_len: the longest prompt + max_new_tokens a request may ask for (None = no limit);
        speculation: the draft-length planner with its cost models (a pipeline keeps one across runs);
        enable_prefix_caching: reuse the cached blocks of equal prefixes; max_num_seqs: requests running at once;
        grammars: the model's grammar compiler, for requests with a constraint or a logit bias (runtime/structured)."""
        check_positive_int(max_num_seqs, "max_num_seqs")
        self.target, self.drafter = target, drafter
        if drafter is not None and speculation is None:
            speculation = Speculation.for_pair(target, drafter)
        self.speculation = speculation
        self.max_model_len = max_model_len
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        # a drafter that cannot start a sequence on cached context rows turns prefix caching off for the pair
        self.prefix_caching = enable_prefix_caching and (drafter is None or drafter.prefix_caching)
        self.detokenize, self.trace = detokenize, trace
        self.grammars = grammars
        self.waiting: list[Request] = []
        self.running: list[Request] = []  # in admission order: the last is preempted first
        self.finished: list[Request] = []
        self.metrics = RunMetrics()
        self._next_id = 0
        # the draft side of every step, with its draft-length planner (None: the target alone)
        self.drafting: DraftStep | None = None
        if drafter is not None:
            self.drafting = DraftStep(
                target, drafter, speculation, self.metrics, max_num_batched_tokens, self.prefix_caching
            )
        self._call_s, self._drafted = 0.0, False
        self._caches = {"target": target.cache_manager}
        if drafter is not None:
            self._caches["draft"] = drafter.cache_manager

    @property
    def caches(self) -> dict[str, CacheManager]:
        """Every cache the requests run on, by name: the target's, then the draft's (one dict, built once: every step
        reads it, and not to be changed)."""
        return self._caches

    def add_request(
        self, prompt: list[int] | np.ndarray, config: GenerationConfig | None = None, images: ImagePrompt | None = None
    ) -> Request:
        """Queue a request; it joins the running batch as soon as the caches have room for its prompt. `images`: the
        images its prompt shows (embeddings at their placeholder tokens) and its three-axis positions."""
        config = config or GenerationConfig()
        request = Request(self._next_id, token_ids(prompt, f"request {self._next_id}"), config, images=images)
        self._check(request)
        check_logit_bias(config.logit_bias, self.target.vocab_size)
        # compiled grammars are cached: a server compiles a request's grammar off this loop before it gets here
        request.constraint = start_constraint(self.grammars, config.constraint, config.logit_bias)
        self._next_id += 1
        self.waiting.append(request)
        return request

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def abort(self, request: Request, reason: FinishReason = FinishReason.ABORT) -> None:
        """Drop a waiting or running request now, returning its blocks in every cache (a client went away); its
        registered full blocks stay cached for the next request that shares its prefix."""
        if request in self.waiting:
            self.waiting.remove(request)
            request.finish_reason, request.status = FinishReason(reason), Status.FINISHED
            self.finished.append(request)
        elif request in self.running:
            request.finish_reason, request.status = FinishReason(reason), Status.FINISHED
            self._release(request)

    def abort_all(self, reason: FinishReason = FinishReason.ABORT) -> None:
        """Abort every unfinished request (an exception or Ctrl-C left the batch half done)."""
        for request in [*self.waiting, *self.running]:
            self.abort(request, reason)

    def run(self) -> list[Request]:
        """Step until every request has finished; returns them in arrival order."""
        while self.has_unfinished():
            self.step()
        return sorted(self.finished, key=lambda r: r.id)

    def step(self) -> list[Request]:
        """One scheduling step: plan, run the target, apply, then the draft call; returns the requests that finished."""
        start = time.perf_counter()
        calibration = self.metrics.calibration_s
        self._call_s, self._drafted = 0.0, False  # the calls' seconds as the cost models see them; a draft call?
        plan = self.schedule()
        done = self.update(plan, self.execute(plan)) if plan.rows else []
        if self.drafting is not None:
            calls = self.drafting.step(self.running)
            self._call_s += calls.catch_up_s  # in the order the calls ran (0.0 without a catch-up)
            self._call_s += calls.draft_s
            self._drafted = calls.drafted
        wall = time.perf_counter() - start
        self.metrics.steps += 1
        self.metrics.wall_s += wall
        if self.speculation is not None:
            # Host time is what the planner adds to a plan beyond its calls' costs: with the calibration in it, the
            # first steps' plans saw ~200 ms of host per step, next to which any draft call looked free (a 16-request
            # first run drafted full blocks at 0.42x the target alone).
            host = wall - self._call_s - (self.metrics.calibration_s - calibration)
            self.speculation.observe_host(host, self._drafted, len(self.running) + len(done))
        return done

    def schedule(self) -> StepPlan:
        """This step's plan: blocks for the running requests' rows (preempting when the pool runs out), admissions
        with their prefix hits, the target call's rows and the draft lengths they verify. Runs no model."""
        plan = StepPlan()
        caches = self.caches
        free_before = {name: cache.free_blocks for name, cache in caches.items()}
        self._grow(plan)
        if not plan.preempted:  # a step that preempted has no room to admit into
            self._admit(plan)
        plan.rows = self._target_batch()
        plan.draft_lengths = {p.request.id: len(p.tokens) - 1 for p in plan.rows if p.request.status is Status.DECODE}
        plan.taps, plan.decode_taps = self._taps_wanted(plan.rows)
        plan.new_blocks = {name: max(free_before[name] - cache.free_blocks, 0) for name, cache in caches.items()}
        return plan

    def _taps_wanted(self, batch: list[TargetRows]) -> tuple[bool, bool]:
        """(whether the target call computes taps, whether its verification rows keep them). While the planner idles
        (backed off all the way, no draft length pinned), a target that can leave the taps out runs without
        (PagedModel.can_skip_taps), and one whose taps are optional (PagedModel.taps_optional) keeps them for prompt
        chunks only: a new request then drafts from its prompt's taps at once. Otherwise calls compute them where a
        request of the call could take them."""
        if self.drafter is None:
            return False, False
        if not self.target.taps_optional:
            return True, True
        idle = self.speculation.pace.idle and not any(r.config.num_assistant_tokens for r in self.running)
        if not self.target.can_skip_taps:
            return True, not idle
        if idle:
            return False, False
        return any(part.request.gap == 0 for part in batch), True

    def _target_batch(self) -> list[TargetRows]:
        """The target call's rows: verification rows first, then prompt chunks."""
        batch, budget = [], self.max_num_batched_tokens
        for request in self.running:
            if request.status is Status.DECODE:
                tokens = [request.anchor, *request.proposal]
                batch.append(TargetRows(request, tokens, list(range(len(tokens))), request.target_len))
                budget -= len(tokens)
        for request in self.running:
            if request.status is Status.PREFILL and (budget > 0 or not batch):
                context = request.context_len
                prompt_left = len(request.prompt) - request.target_len
                # a request keeping every row's logits (its prompt logprobs) takes PROMPT_LOGPROB_ROWS a chunk at most
                rows = budget if request.config.prompt_logprobs is None else min(budget, PROMPT_LOGPROB_ROWS)
                n = prompt_chunk(context - request.target_len, rows, prompt_left)  # never a lone prompt row
                chunk = request.committed(request.target_len, request.target_len + n)
                last = request.target_len + n == context
                wanted = [n - 1] if last else []
                if request.config.prompt_logprobs is not None:
                    wanted = list(range(n))  # every row's logits: the prompt's logprobs
                batch.append(TargetRows(request, chunk, wanted, request.target_len))
                budget -= n
        return batch

    def _release(self, request: Request) -> None:
        if self.drafting is not None:
            self.drafting.planner.released(request)
        request.metrics.finish_time = time.perf_counter()
        request.metrics.num_generated_tokens = len(request.generated)
        # a stop string sets the text, "" when it starts the output: only the other endings decode the tokens here
        if request.finish_reason is not FinishReason.STOP_STRING and self.detokenize is not None:
            request.text = self.detokenize(request.generated)
        self._free_caches(request)
        self.running.remove(request)
        self.finished.append(request)
        self.metrics.add(request.metrics)

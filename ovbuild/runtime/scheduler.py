"""Continuous batching with speculative decoding: one target call and one draft call per step for all requests.

Each step is planned, run, then applied (the shape of vLLM's v1 scheduler):
  1. `schedule()` returns a StepPlan: the running requests take the blocks this step's rows need (blocks on demand;
     when the pool runs out the most recently admitted running request is preempted: its blocks are freed and it
     goes back to the front of the queue, to be recomputed later with its committed tokens joined to its prompt),
     then waiting requests are admitted, each starting on the longest prefix every cache holds (prefix caching,
     ovbuild.runtime.prefix; one whose first block a running request is still prefilling waits for its blocks, so n
     samples of a prompt compute it once; one asking for prompt logprobs runs all its rows, in bounded chunks), and
     the target call is packed: the verification rows [anchor, d1..dk] of decoding requests (on CPU each row a
     1-row subsequence, so that it rounds as a decode step does; the plan's draft_lengths hold each k) and prompt
     chunks of prefilling ones (bounded by max_num_batched_tokens);
  2. `execute(plan)` runs the target call;
  3. `update(plan, outputs)` verifies (ovbuild.runtime.commit: greedy, the longest prefix where d_i equals the
     target's argmax, then the target's token; a sampling request through ovbuild.runtime.verify, on the rows'
     logits; a request with penalties reads its rows penalized, and its greedy tokens are their host argmax; one
     asking for logprobs keeps those of its committed rows) and appends the committed tokens; the cache manager
     commits the accepted rows (registering full blocks for prefix caching, keeping a hybrid target's
     linear-attention state after the last accepted row) and the rejected rows are never committed: the next call's
     past_lens overwrites them; finished requests free their blocks;
  4. the draft side (ovbuild.runtime.draft_step) plans: a DraftPlan with the draft length of every decoding request
     (pinned by num_assistant_tokens, else by ovbuild.runtime.speculation from measured call costs and each
     request's acceptance; 0 = no draft for it), chosen by a DraftPlanner that keeps its own backoff counters;
  5. `DraftStep.execute` runs that plan (it never plans): one draft call, when any request drafts, packs per request
     the target taps it has not seen and a block of the chosen length; with no request drafting there is no draft
     call and the taps wait for the next one.
While the planner has backed off all the way (drafting has not paid for a while) and no request pins a draft length,
target calls run without taps where the target can leave them out (PagedModel.can_skip_taps); a request that is to
draft again first gets the taps it missed (ovbuild.runtime.catch_up, run before the draft call).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ovbuild.errors import CacheExhaustedError, UnsupportedError
from ovbuild.ir.ports import GREEDY_IDS, INPUT_IDS, LOGITS, LOGITS_INDICES, POSITION_IDS
from ovbuild.runtime.cache_manager import CacheManager
from ovbuild.runtime.commit import append_tokens, first_token, record_prompt_logprobs, verified_tokens
from ovbuild.runtime.draft_step import DraftStep
from ovbuild.runtime.drafters.base import Drafter, Proposal
from ovbuild.runtime.images import ImageCall, ImagePrompt, check_images
from ovbuild.runtime.logprobs import PROMPT_LOGPROB_ROWS
from ovbuild.runtime.metrics import RunMetrics
from ovbuild.runtime.paged_model import TAPS, PagedModel
from ovbuild.runtime.prefix import prefilling_its_first_block, prefix_hits
from ovbuild.runtime.request import FinishReason, GenerationConfig, Request, Status
from ovbuild.runtime.rows import sequence_rows
from ovbuild.runtime.speculation import MAX_PLAN_BACKOFF, Speculation
from ovbuild.runtime.validation import check_positive_int, check_prompt, token_ids

DEFAULT_MAX_NUM_SEQS = 256


@dataclass
class TargetRows:
    """One request's share of the target call: its rows' tokens, and the rows whose logits are read."""

    request: Request
    tokens: list[int]
    wanted: list[int]
    start: int  # the request's committed length before the call (its rows' first position)


@dataclass
class StepPlan:
    """What one step does: who was admitted (with the cached tokens each starts on), who was preempted, the blocks
    taken per cache, the target call's rows, and the draft length each decoding request has verified in them (chosen
    by the previous step's DraftPlan)."""

    rows: list[TargetRows] = field(default_factory=list)
    admitted: list[Request] = field(default_factory=list)
    hits: dict[int, int] = field(default_factory=dict)  # request id -> cached tokens it starts on
    preempted: list[Request] = field(default_factory=list)
    new_blocks: dict[str, int] = field(default_factory=dict)  # cache name -> blocks taken while planning
    taps: bool = False  # whether the target call computes taps
    draft_lengths: dict[int, int] = field(default_factory=dict)  # decoding request id -> proposals verified (its k)


class Scheduler:
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
    ):
        """max_model_len: the longest prompt + max_new_tokens a request may ask for (None = no limit);
        speculation: the draft-length planner with its cost models (a pipeline keeps one across runs);
        enable_prefix_caching: reuse the cached blocks of equal prefixes; max_num_seqs: requests running at once."""
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

    @property
    def caches(self) -> dict[str, CacheManager]:
        """Every cache the requests run on, by name."""
        caches = {"target": self.target.cache_manager}
        if self.drafter is not None:
            caches["draft"] = self.drafter.cache_manager
        return caches

    def add_request(
        self, prompt: list[int] | np.ndarray, config: GenerationConfig | None = None, images: ImagePrompt | None = None
    ) -> Request:
        """Queue a request; it joins the running batch as soon as the caches have room for its prompt. `images`: the
        images its prompt shows (embeddings at their placeholder tokens) and its three-axis positions."""
        config = config or GenerationConfig()
        request = Request(self._next_id, token_ids(prompt, f"request {self._next_id}"), config, images=images)
        self._check(request)
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
            self.speculation.observe_host(host, self._drafted)
        return done

    # -- admission -------------------------------------------------------------------------------------------------

    def _check(self, request: Request) -> None:
        k = request.config.num_assistant_tokens
        if self.drafter is not None and k is not None and not 0 <= k <= self.drafter.max_candidates:
            raise UnsupportedError(
                f"num_assistant_tokens = {k}: this draft proposes at most {self.drafter.max_candidates} tokens per step"
            )
        if len(request.prompt) == 0:
            raise UnsupportedError("empty prompt: at least one token is needed")
        if request.images is not None:
            check_images(request.images, len(request.prompt), self.target.image_width, f"request {request.id}")
        limits = self.target.vocab_size, self.max_model_len
        check_prompt(request.prompt, request.config.max_new_tokens, *limits, f"request {request.id}")
        for name, cache, length in self.budgets(request):
            if not cache.fits(length):
                raise CacheExhaustedError(
                    f"a request of {len(request.prompt)} prompt tokens and max_new_tokens="
                    f"{request.config.max_new_tokens} does not fit the {name} cache even when it is empty: it needs "
                    f"{cache.blocks_for(length)} {name} cache blocks; the cache has {cache.num_blocks} (raise the "
                    f"{name} cache size)"
                )

    def budgets(self, request: Request) -> list[tuple[str, CacheManager, int]]:
        """(name, cache, tokens) for every cache the request runs on: the most it may ever hold, which must fit the
        cache alone (else the request is refused when it is added; preemption makes room for anything less).

        A request commits at most its prompt and max_new_tokens to a cache, and one call writes rows past what is
        committed: the target at most the anchor and the longest proposal, the draft its longest block."""
        tokens = len(request.prompt) + request.config.max_new_tokens
        if self.drafter is None:
            return [("target", self.target.cache_manager, tokens + 1)]
        longest, offset = self.drafter.max_candidates, self.drafter.candidate_offset
        return [
            ("target", self.target.cache_manager, tokens + 1 + longest),
            ("draft", self.drafter.cache_manager, tokens + offset + longest),
        ]

    def _step_lengths(self, request: Request, end: int) -> dict[str, int]:
        """Tokens each cache must hold for a step whose target rows of `request` end at `end` (and its draft call).

        The draft call after it writes the request's context rows (at most up to `end`) and a block of its next
        proposal, never longer than the tokens the request may still generate: so no step needs more than the
        request's budget (`budgets`), and a request that fits alone always runs."""
        lengths = {"target": end}
        if self.drafter is not None:
            longest = min(self.drafter.max_candidates, max(request.remaining - 1, 0))
            lengths["draft"] = end + longest + self.drafter.candidate_offset
        return lengths

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
        plan.taps = self._taps_wanted(plan.rows)
        plan.new_blocks = {name: max(free_before[name] - cache.free_blocks, 0) for name, cache in caches.items()}
        return plan

    def _grow(self, plan: StepPlan) -> None:
        """Blocks for every running request's rows of this step, oldest first; when a cache runs out, the most recently
        admitted running request is preempted (the one growing itself, when it is the last)."""
        caches = self.caches.items()  # once per step: the property builds its dict each time it is asked
        for request in list(self.running):
            if request not in self.running:
                continue  # preempted for an older one
            rows = self._rows_wanted(request)
            while True:
                lengths = self._step_lengths(request, request.target_len + rows)
                if all(cache.can_hold(request.id, lengths[name]) for name, cache in caches):
                    for name, cache in caches:
                        cache.reserve(request.id, lengths[name])
                    break
                victim = self.running[-1]
                if victim is request and len(self.running) == 1:
                    raise CacheExhaustedError(
                        f"request {request.id} does not fit the caches even alone ({lengths} tokens asked)"
                    )
                self._preempt(victim, plan)
                if victim is request:
                    break

    def _rows_wanted(self, request: Request) -> int:
        """Target rows the request runs this step at most: its verification rows, or what is left of its prompt."""
        if request.status is Status.DECODE:
            return 1 + len(request.proposal)
        return min(request.context_len - request.target_len, self.max_num_batched_tokens)

    def _preempt(self, request: Request, plan: StepPlan) -> None:
        """Free every block of a running request and queue it first again: it is recomputed later, its committed
        tokens joined to its prompt (a prefix hit, when its blocks are still cached)."""
        self._free_caches(request)
        request.status = Status.WAITING
        request.target_len = request.taps_len = request.pending_rows = 0
        request.pending_taps, request.proposal = [], Proposal()
        request.num_preemptions += 1
        self.running.remove(request)
        self.waiting.insert(0, request)
        self.metrics.num_preemptions += 1
        plan.preempted.append(request)
        if self.drafting is not None:
            self.drafting.planner.batch_changed()

    def _admit(self, plan: StepPlan) -> None:
        """FIFO admission while fewer than max_num_seqs run and every cache has room for the request's whole context
        (after its prefix hit); it then grows block by block as it decodes."""
        while self.waiting and len(self.running) < self.max_num_seqs:
            request = self.waiting[0]
            if self._prefills_its_prefix(request):
                break  # admitted once that prefill is committed, starting on its blocks
            hit, draft_hit = self._prefix_hits(request)
            if not self._start(request, hit, draft_hit):
                break
            request.status = Status.PREFILL
            request.target_len, request.taps_len = hit, draft_hit
            request.num_cached_tokens = hit
            if request.acceptance is None and self.speculation is not None:
                request.acceptance = self.speculation.new_stats()
            self.metrics.prefix_cache_queries += request.context_len
            self.metrics.prefix_cache_hits += hit
            self.running.append(self.waiting.pop(0))
            plan.admitted.append(request)
            plan.hits[request.id] = hit

    def _prefills_its_prefix(self, request: Request) -> bool:
        """Whether a running request is still prefilling this one's first block (ovbuild.runtime.prefix)."""
        if not self.prefix_caching or request.config.prompt_logprobs is not None:
            return False
        prefilling = (r for r in self.running if r.status is Status.PREFILL)
        return prefilling_its_first_block(request, prefilling, self.target.cache_manager.block_size)

    def _prefix_hits(self, request: Request) -> tuple[int, int]:
        """(target, draft) tokens of the request's context found cached (ovbuild.runtime.prefix.prefix_hits)."""
        if not self.prefix_caching or request.config.prompt_logprobs is not None:
            return 0, 0  # prompt logprobs come from the prompt's rows: they all run
        draft = self.drafter.cache_manager if self.drafter is not None else None
        return prefix_hits(request, self.target.cache_manager, draft, self.target.states is not None)

    def _start(self, request: Request, hit: int, draft_hit: int) -> bool:
        """Give the request its cached prefix and blocks for its whole context in every cache; False (holding
        nothing) when some cache lacks the room now."""
        lengths = self._step_lengths(request, request.context_len + 1)
        hits = {"target": hit, "draft": draft_hit}
        started = []
        try:
            for name, cache in self.caches.items():
                started.append(cache)
                if hits[name]:
                    cache.resume(request.id, request.block_hashes(cache.block_size, hits[name]), hits[name])
                cache.reserve(request.id, lengths[name])
        except CacheExhaustedError:
            for cache in started:
                cache.free(request.id)
            return False
        if self.drafter is not None:
            self.drafter.resume(request.id, draft_hit)
        return True

    # -- target call and verification -----------------------------------------------------------------------------

    def execute(self, plan: StepPlan) -> dict[str, np.ndarray]:
        """Run the plan's target call; returns its outputs (taps copied: the requests keep slices of them)."""
        rows, ids, positions, wanted = [], [], [], []
        state_rows = [] if self.target.states is not None else None
        images = ImageCall(self.target.image_width) if self.target.image_width is not None else None
        for part in plan.rows:
            request, tokens = part.request, part.tokens
            begin = len(ids)
            # each verification row a subsequence of its own, attending to the rows before it in the cache: the
            # kernel a 1-row decode runs, so rows round as the target alone's do (see PagedModel)
            one_per_row = request.status is Status.DECODE and self.target.row_subsequences
            rows += sequence_rows(request.id, request.target_len, len(tokens), one_per_row)
            if state_rows is not None:
                # states after every verification row (the last accepted one is kept), after a prompt chunk's last
                # row and its snapshot rows (the cache manager's choice)
                decoding = request.status is Status.DECODE
                state_rows.append(self.target.cache_manager.state_rows(request.target_len, len(tokens), decoding))
            if images is not None:  # three-axis positions, and the embeddings of the image rows among the tokens
                images.add(request.images, request.target_len, len(tokens), begin)
            ids += tokens
            positions += range(request.target_len, request.target_len + len(tokens))
            wanted += [begin + w for w in part.wanted]
        feeds = {INPUT_IDS: ids, POSITION_IDS: positions, LOGITS_INDICES: wanted}  # lists: see InputBinder
        if images is not None:
            feeds |= images.inputs()
        compiled, start = self.target.compile_s, time.perf_counter()
        out = self.target.run(rows, feeds, state_rows, plan.taps)
        seconds = time.perf_counter() - start
        self.metrics.target_infer_s += seconds
        self._call_s += seconds
        if self.speculation is not None and self.target.compile_s == compiled:
            # A call that compiled a copy for its row count (and ran it first, allocating its memory) is a one-off,
            # 10-20x a steady call on the demo pair: a cost curve that kept it never drafted at that size again.
            self.speculation.target_cost.observe(len(ids), seconds)
        outputs = dict(out)
        if plan.taps and out.get(TAPS) is not None:
            outputs[TAPS] = out[TAPS].copy()  # one copy per call: the requests keep slices of it for the draft
        else:
            outputs.pop(TAPS, None)
        return outputs

    def update(self, plan: StepPlan, outputs: dict[str, np.ndarray]) -> list[Request]:
        """Apply the target call's outputs: verify, commit the accepted rows to the caches, free finished requests;
        returns the requests that finished."""
        greedy = outputs[GREEDY_IDS].tolist()  # [R], the argmax computed inside the graph (ints: compared one by one)
        logits = outputs[LOGITS]  # [R, V], a view of the output tensor: only sampling requests read their rows
        hidden = outputs.get(TAPS)
        done, row, logit_row = [], 0, 0
        for part in plan.rows:
            request, tokens, want = part.request, part.tokens, part.wanted
            taps = hidden[row : row + len(tokens)] if hidden is not None else None
            rows = slice(logit_row, logit_row + len(want))
            if request.status is Status.PREFILL:
                self._prefilled(request, tokens, taps, greedy[rows], logits[rows])
            else:
                self._verify(request, greedy[rows], taps, logits[rows])
            if request.status is Status.FINISHED:
                done.append(request)
            row += len(tokens)
            logit_row += len(want)
        for request in done:
            self._release(request)
        return done

    def _commit_rows(self, request: Request, start: int) -> None:
        """The target cache keeps the request's rows from `start` to its committed length (the rest were rejected)."""
        cache = self.target.cache_manager
        hashes = request.block_hashes(cache.block_size, request.target_len) if self.prefix_caching else None
        cache.commit(request.id, start, request.target_len, hashes)

    def _taps_wanted(self, batch: list[TargetRows]) -> bool:
        """Whether the target call computes taps: with a draft, unless the target can leave them out and either the
        planner has backed off all the way with no draft length pinned, or no request of the call could take them."""
        if self.drafter is None:
            return False
        if not self.target.can_skip_taps:
            return True
        idle = self.speculation.backoff >= MAX_PLAN_BACKOFF
        if idle and not any(r.config.num_assistant_tokens for r in self.running):
            return False
        return any(part.request.gap == 0 for part in batch)

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
                n = min(context - request.target_len, max(budget, 1))
                if request.config.prompt_logprobs is not None:
                    n = min(n, PROMPT_LOGPROB_ROWS)  # every row's logits are kept
                chunk = request.committed(request.target_len, request.target_len + n)
                last = request.target_len + n == context
                wanted = [n - 1] if last else []
                if request.config.prompt_logprobs is not None:
                    wanted = list(range(n))  # every row's logits: the prompt's logprobs
                batch.append(TargetRows(request, chunk, wanted, request.target_len))
                budget -= n
        return batch

    def _prefilled(self, request: Request, chunk: list[int], taps, greedy: list[int], logits: np.ndarray) -> None:
        if taps is not None and request.gap == 0:  # after a gap, taps wait for the catch-up (they must be in order)
            request.add_taps(taps)
        start = request.target_len
        if request.config.prompt_logprobs is not None:
            record_prompt_logprobs(request, start, logits)
        request.target_len += len(chunk)
        self._commit_rows(request, start)
        if request.target_len == request.context_len:
            request.status = Status.DECODE
            if self.drafting is not None:
                self.drafting.planner.started(request)
            if request.generated:
                return  # recomputed after a preemption: its next token comes from verifying its anchor
            request.metrics.first_token_time = time.perf_counter()
            append_tokens(request, [first_token(request, greedy[-1], logits[-1:])], logits[-1:], self.detokenize)

    def _verify(self, request: Request, greedy: list[int], taps, logits: np.ndarray) -> None:
        proposal = request.proposal
        committed = verified_tokens(request, greedy, logits)
        accepted = len(committed) - 1
        if self.trace:
            request.trace.append(
                {"anchor_position": request.target_len, "proposed": list(proposal), "accepted": accepted}
            )
        request.metrics.record_verification(len(proposal), accepted)
        if self.speculation is not None:
            self.speculation.record(request.acceptance, len(proposal), accepted)
        if taps is not None and request.gap == 0:
            request.add_taps(taps[: accepted + 1])
        start = request.target_len
        request.target_len += accepted + 1  # the anchor and the accepted draft tokens are now in the target cache
        request.proposal = Proposal()
        append_tokens(request, committed, logits, self.detokenize)
        # after the tokens are appended: the blocks' hashes read them; a hybrid's state after row `accepted`
        self._commit_rows(request, start)

    def _release(self, request: Request) -> None:
        if self.drafting is not None:
            self.drafting.planner.released(request)
        request.metrics.finish_time = time.perf_counter()
        request.metrics.num_generated_tokens = len(request.generated)
        if not request.text and self.detokenize is not None:
            request.text = self.detokenize(request.generated)
        self._free_caches(request)
        self.running.remove(request)
        self.finished.append(request)
        self.metrics.add(request.metrics)

    def _free_caches(self, request: Request) -> None:
        """Return the request's blocks (and state slot) in every cache; registered blocks stay cached."""
        self.target.free(request.id)
        if self.drafter is not None:
            self.drafter.free(request.id)

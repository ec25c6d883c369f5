"""Admission with prefix hits: how much of a waiting request's context every cache already holds (the block hashes:
ovbuild.runtime.cache.prefix), and whether it waits for a running request that is prefilling its first block."""

from __future__ import annotations

from collections.abc import Iterable

from ovbuild.errors import CacheExhaustedError, UnsupportedError
from ovbuild.runtime.cache.cache_manager import CacheManager
from ovbuild.runtime.cache.rows import prompt_chunk
from ovbuild.runtime.draft_step import DraftStep
from ovbuild.runtime.images import check_images
from ovbuild.runtime.metrics import RunMetrics
from ovbuild.runtime.model.paged_model import PagedModel
from ovbuild.runtime.request import Request, Status
from ovbuild.runtime.speculation.drafters.base import Drafter, Proposal
from ovbuild.runtime.speculation.planner import Speculation
from ovbuild.runtime.step_plan import StepPlan
from ovbuild.runtime.validation import check_prompt


def prefix_hits(request: Request, target: CacheManager, draft: CacheManager | None, stateful: bool) -> tuple[int, int]:
    """(target, draft) tokens of the request's context found cached: whole blocks, never the last context token
    (its row must run: its logits give the first token), nor all prompt tokens but the last (a lone prompt row runs
    in another kernel than the chunk it ran in uncached: ovbuild.runtime.cache.rows); on a target with states
    (`stateful`), up to the last state snapshot within them. The target starts on its own hit whatever the draft's
    cache holds; the draft's hit is at most the target's, and when it is shorter (a draft that sat idle never wrote
    those context rows) the taps in between are a gap the target computes again only if the request drafts
    (ovbuild.runtime.catch_up). draft None: the target alone."""
    limit = request.context_len - 1
    hit = target.cached_prefix(request.block_hashes(target.block_size, limit))
    if hit and not stateful and len(request.prompt) - hit == 1:
        hit -= target.block_size  # a lone prompt row would run in the decode kernel (ovbuild.runtime.cache.rows)
    if draft is None:
        return hit, 0
    draft_hit = min(draft.cached_prefix(request.block_hashes(draft.block_size, limit)), hit)
    return hit, draft_hit - draft_hit % draft.block_size


def prefilling_its_first_block(request: Request, prefilling: Iterable[Request], block_size: int) -> bool:
    """Whether one of the `prefilling` requests is computing the request's first block (n samples of one prompt,
    queued together): waiting for it lets the request start on the cached block instead of computing it again."""
    if request.context_len <= block_size:
        return False
    first = request.block_hashes(block_size, block_size)
    return any(r.context_len > block_size and r.block_hashes(block_size, block_size) == first for r in prefilling)


class Admission:
    """The scheduler's admission side (mixed into ovbuild.runtime.scheduler.Scheduler, whose state it reads): refusing
    what can never fit, blocks for the running requests' rows with preemption when a cache runs out, and admitting
    waiting requests on their prefix hits."""

    target: PagedModel
    drafter: Drafter | None
    speculation: Speculation | None
    drafting: DraftStep | None
    metrics: RunMetrics
    waiting: list[Request]
    running: list[Request]
    caches: dict[str, CacheManager]  # the scheduler's property: every cache the requests run on, by name
    prefix_caching: bool
    max_model_len: int | None
    max_num_batched_tokens: int
    max_num_seqs: int

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

    def _step_lengths(self, request: Request, end: int) -> list[int]:
        """Tokens each cache must hold for a step whose target rows of `request` end at `end` (and its draft call), in
        the order of `caches`: the target's, then the draft's.

        The draft call after it writes the request's context rows (at most up to `end`) and a block of its next
        proposal, never longer than the tokens the request may still generate: so no step needs more than the
        request's budget (`budgets`), and a request that fits alone always runs."""
        if self.drafter is None:
            return [end]
        longest = min(self.drafter.max_candidates, max(request.remaining - 1, 0))
        return [end, end + longest + self.drafter.candidate_offset]

    def _grow(self, plan: StepPlan) -> None:
        """Blocks for every running request's rows of this step, oldest first; when a cache runs out, the most recently
        admitted running request is preempted (the one growing itself, when it is the last)."""
        caches = list(self.caches.values())
        for request in list(self.running):
            if request not in self.running:
                continue  # preempted for an older one
            rows = self._rows_wanted(request)
            while True:
                lengths = self._step_lengths(request, request.target_len + rows)
                if all(cache.holds(request.id, n) for cache, n in zip(caches, lengths, strict=True)):
                    break  # every step of a decoding request but one in block_size: kept cheap
                if all(cache.can_hold(request.id, n) for cache, n in zip(caches, lengths, strict=True)):
                    for cache, n in zip(caches, lengths, strict=True):
                        cache.reserve(request.id, n)
                    break
                victim = self.running[-1]
                if victim is request and len(self.running) == 1:
                    asked = dict(zip(self.caches, lengths, strict=True))
                    raise CacheExhaustedError(
                        f"request {request.id} does not fit the caches even alone ({asked} tokens asked)"
                    )
                self._preempt(victim, plan)
                if victim is request:
                    break

    def _rows_wanted(self, request: Request) -> int:
        """Target rows the request runs this step at most: its verification rows, or what is left of its prompt."""
        if request.status is Status.DECODE:
            return 1 + len(request.proposal)
        left, prompt_left = request.context_len - request.target_len, len(request.prompt) - request.target_len
        return prompt_chunk(left, self.max_num_batched_tokens, prompt_left)

    def _preempt(self, request: Request, plan: StepPlan) -> None:
        """Free every block of a running request and queue it first again: it is recomputed later, its committed
        tokens joined to its prompt (a prefix hit, when its blocks are still cached)."""
        self._free_caches(request)
        request.status = Status.WAITING
        request.target_len = request.taps_len = 0
        request.drop_taps()
        request.proposal = Proposal()
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
        """Whether a running request is still prefilling this one's first block (ovbuild.runtime.admission)."""
        if not self.prefix_caching or request.config.prompt_logprobs is not None:
            return False
        prefilling = (r for r in self.running if r.status is Status.PREFILL)
        return prefilling_its_first_block(request, prefilling, self.target.cache_manager.block_size)

    def _prefix_hits(self, request: Request) -> tuple[int, int]:
        """(target, draft) tokens of the request's context found cached (ovbuild.runtime.admission.prefix_hits)."""
        if not self.prefix_caching or request.config.prompt_logprobs is not None:
            return 0, 0  # prompt logprobs come from the prompt's rows: they all run
        draft = self.drafter.cache_manager if self.drafter is not None else None
        return prefix_hits(request, self.target.cache_manager, draft, self.target.states is not None)

    def _start(self, request: Request, hit: int, draft_hit: int) -> bool:
        """Give the request its cached prefix and blocks for its whole context in every cache; False (holding
        nothing) when some cache lacks the room now."""
        lengths = self._step_lengths(request, request.context_len + 1)
        started = []
        try:
            for cache, cached, length in zip(self.caches.values(), (hit, draft_hit), lengths, strict=False):
                started.append(cache)
                if cached:
                    cache.resume(request.id, request.block_hashes(cache.block_size, cached), cached)
                cache.reserve(request.id, length)
        except CacheExhaustedError:
            for cache in started:
                cache.free(request.id)
            return False
        if self.drafter is not None:
            self.drafter.resume(request.id, draft_hit)
        return True

    def _free_caches(self, request: Request) -> None:
        """Return the request's blocks (and state slot) in every cache; registered blocks stay cached."""
        self.target.free(request.id)
        if self.drafter is not None:
            self.drafter.free(request.id)

"""The target call of a step and its verification: run the plan's rows, then commit what each request accepted
(ovbuild.runtime.commit: the accepted draft tokens and the target's own) to the request and the target cache."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from ovbuild.ir.ports import GREEDY_IDS, INPUT_IDS, LOGITS, LOGITS_INDICES, POSITION_IDS
from ovbuild.runtime.cache.rows import sequence_rows
from ovbuild.runtime.commit import append_tokens, first_token, record_prompt_logprobs, verified_tokens
from ovbuild.runtime.draft_step import DraftStep
from ovbuild.runtime.images import ImageCall
from ovbuild.runtime.metrics import RunMetrics
from ovbuild.runtime.model.paged_model import TAPS, PagedModel
from ovbuild.runtime.request import Request, Status
from ovbuild.runtime.speculation.drafters.base import Proposal
from ovbuild.runtime.speculation.planner import Speculation
from ovbuild.runtime.step_plan import StepPlan


class Verification:
    """The scheduler's target side (mixed into ovbuild.runtime.scheduler.Scheduler, whose state it reads): the target
    call of a plan, and applying its outputs: prompt chunks prefilled, proposals verified, accepted rows committed,
    finished requests released (Scheduler._release)."""

    target: PagedModel
    speculation: Speculation | None
    drafting: DraftStep | None
    metrics: RunMetrics
    prefix_caching: bool
    detokenize: Callable[[list[int]], str] | None
    trace: bool
    _call_s: float

    def execute(self, plan: StepPlan) -> dict[str, np.ndarray]:
        """Run the plan's target call; returns its outputs (taps copied: the requests keep slices of them)."""
        rows, ids, positions, wanted = [], [], [], []
        state_rows = [] if self.target.states is not None else None
        images = ImageCall(self.target.image_width) if self.target.image_width is not None else None
        for part in plan.rows:
            request, tokens = part.request, part.tokens
            begin = len(ids)
            # each verification row a subsequence of its own, attending to the rows before it in the cache: the
            # kernel a 1-row decode runs, so rows round as the target alone's do (see PagedModel); so do the generated
            # tokens a preempted request computes again (ovbuild.runtime.cache.rows)
            generated = request.status is Status.DECODE or request.target_len >= len(request.prompt)
            one_per_row = generated and self.target.row_subsequences
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
        if not plan.taps:
            outputs.pop(TAPS, None)  # the requests copy their rows of the taps when kept (Request.add_taps)
        return outputs

    def update(self, plan: StepPlan, outputs: dict[str, np.ndarray]) -> list[Request]:
        """Apply the target call's outputs: verify, commit the accepted rows to the caches, free finished requests;
        returns the requests that finished."""
        greedy = outputs[GREEDY_IDS].tolist()  # [R], the argmax computed inside the graph (ints: compared one by one)
        logits = outputs[LOGITS]  # [R, V], a view of the output tensor: only sampling requests read their rows
        hidden = outputs.get(TAPS)  # [rows, taps width]: the requests keep their rows of it for the draft
        done, row, logit_row = [], 0, 0
        for part in plan.rows:
            request, tokens, want = part.request, part.tokens, part.wanted
            rows = slice(logit_row, logit_row + len(want))
            if request.status is Status.PREFILL:
                self._prefilled(request, tokens, hidden, row, greedy[rows], logits[rows])
            else:
                self._verify(request, greedy[rows], hidden if plan.decode_taps else None, row, logits[rows])
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

    def _prefilled(
        self, request: Request, chunk: list[int], hidden, row: int, greedy: list[int], logits: np.ndarray
    ) -> None:
        """hidden: the call's taps (None without), the chunk's from `row` on."""
        if hidden is not None and request.gap == 0:  # after a gap, taps wait for the catch-up (they must be in order)
            request.add_taps(hidden, row, len(chunk))
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

    def _verify(self, request: Request, greedy: list[int], hidden, row: int, logits: np.ndarray) -> None:
        """hidden: the call's taps (None without), the request's verification rows' from `row` on."""
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
        if hidden is not None and request.gap == 0:
            request.add_taps(hidden, row, accepted + 1)  # the anchor's and the accepted proposals' rows
        start = request.target_len
        request.target_len += accepted + 1  # the anchor and the accepted draft tokens are now in the target cache
        request.proposal = Proposal()
        append_tokens(request, committed, logits, self.detokenize)
        # after the tokens are appended: the blocks' hashes read them; a hybrid's state after row `accepted`
        self._commit_rows(request, start)

"""A generation request and its lifecycle inside the scheduler."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ovbuild.errors import ConfigError
from ovbuild.runtime.cache.prefix import chain_hashes
from ovbuild.runtime.decode.detokenizer import Detokenizer
from ovbuild.runtime.decode.logprobs import TokenLogprob, check_logprobs
from ovbuild.runtime.decode.penalties import Penalties, check_penalties
from ovbuild.runtime.decode.sampling import SamplingParams, check_sampling, check_verification
from ovbuild.runtime.images import ImagePrompt
from ovbuild.runtime.metrics import RequestMetrics
from ovbuild.runtime.speculation.acceptance import AcceptanceStats
from ovbuild.runtime.speculation.drafters.base import Proposal
from ovbuild.runtime.structured.spec import Constraint, check_logit_bias
from ovbuild.runtime.validation import check_positive_int, check_stop_strings

if TYPE_CHECKING:
    from ovbuild.runtime.structured.state import OutputConstraint


MIN_TAP_ROWS = 16  # a request's first buffer of pending taps (see Request.add_taps)
KEPT_TAP_BYTES = 1 << 20  # a buffer of pending taps this large at most is kept once taken (see Request.take_taps)


@dataclass(frozen=True)
class GenerationConfig:
    """Per-request settings: when to stop, how many draft tokens to verify per step, greedy (default) or sampling
    (OpenVINO GenAI's names; top_k 0 and top_p 1 are off)."""

    max_new_tokens: int = 64
    eos_token_ids: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()
    num_assistant_tokens: int | None = None  # draft tokens verified per step; None = chosen each step (adaptive)
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    rng_seed: int = 0
    speculative_sampling: str = "exact"  # how sampled draft tokens are verified: sampling.VERIFICATIONS
    repetition_penalty: float = 1.0  # 1 = off; penalties as ovbuild.runtime.decode.penalties applies them
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    min_new_tokens: int = 0  # EOS is held back until this many tokens were generated
    logprobs: int | None = None  # each generated token's logprob and this many alternatives; None = off
    prompt_logprobs: int | None = None  # the same for each prompt token but the first; skips the prefix cache
    constraint: Constraint | None = None  # structured output: the grammar the output follows (runtime/structured)
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, value added to its logit), OpenAI's logit_bias

    def __post_init__(self):
        # checked here, before any request is queued: a negative value would break the worst-case reservation
        check_positive_int(self.max_new_tokens, "max_new_tokens")
        check_stop_strings(self.stop_strings, "stop_strings")
        check_sampling(self.temperature, self.top_k, self.top_p, self.rng_seed, self.do_sample)
        check_verification(self.speculative_sampling)
        check_penalties(self.repetition_penalty, self.presence_penalty, self.frequency_penalty, self.min_new_tokens)
        check_logprobs(self.logprobs, "logprobs")
        check_logprobs(self.prompt_logprobs, "prompt_logprobs")
        if self.constraint is not None and not isinstance(self.constraint, Constraint):
            raise ConfigError(f"constraint must be a Constraint, got {type(self.constraint).__name__}")
        object.__setattr__(self, "logit_bias", check_logit_bias(self.logit_bias))
        if self.min_new_tokens > self.max_new_tokens:
            raise ConfigError(
                f"min_new_tokens = {self.min_new_tokens} is more than max_new_tokens = {self.max_new_tokens}"
            )

    @property
    def sampling(self) -> SamplingParams | None:
        """The sampling parameters, or None for greedy decoding."""
        if not self.do_sample:
            return None
        return SamplingParams(self.temperature, self.top_k, self.top_p, self.rng_seed, self.speculative_sampling)

    @property
    def penalties(self) -> Penalties | None:
        """The logit penalties, or None when none changes the logits."""
        penalties = Penalties(
            self.repetition_penalty,
            self.presence_penalty,
            self.frequency_penalty,
            self.min_new_tokens,
            self.eos_token_ids,
        )
        return penalties if penalties.active else None


class Status(enum.Enum):
    WAITING = "waiting"
    PREFILL = "prefill"
    DECODE = "decode"
    FINISHED = "finished"


class FinishReason(str, enum.Enum):
    """Why a request finished (a str: equal to its value, and written as it in JSON)."""

    STOP = "stop"  # an EOS token
    STOP_STRING = "stop_string"
    LENGTH = "length"  # max_new_tokens
    ABORT = "abort"  # its client went away, or a streamer stopped it
    SHUTDOWN = "shutdown"
    ERROR = "error"  # the step loop failed
    GRAMMAR = "grammar"  # its constraint allows no token and is not complete (runtime/structured); output kept

    def __str__(self) -> str:
        return self.value


@dataclass(eq=False)
class Request:
    """One sequence: prompt, committed tokens, and where target and draft caches stand."""

    id: int
    prompt: np.ndarray
    config: GenerationConfig
    status: Status = Status.WAITING
    generated: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    text: str = ""
    target_len: int = 0  # tokens committed to the target cache (the anchor is not among them)
    # [capacity, width]: its first pending_rows rows are the target taps the draft has not seen yet (see add_taps)
    pending_taps: np.ndarray | None = None
    pending_rows: int = 0
    # tokens, from the first, whose taps the draft has been given or has pending; fewer than target_len after calls
    # that ran without taps (a gap, which ovbuild.runtime.catch_up closes before the request drafts again)
    taps_len: int = 0
    proposal: Proposal = field(default_factory=Proposal)  # draft tokens to verify in the next target call
    metrics: RequestMetrics = field(default_factory=RequestMetrics)
    acceptance: AcceptanceStats | None = None  # per-position acceptance, for the draft-length plan
    skipped_at: int = 0  # the draft planner's count of plan-less steps when this request's share was last accounted
    trace: list[dict] = field(default_factory=list)
    hashes: dict[int, list[bytes]] = field(default_factory=dict)  # block size -> chained hashes of committed blocks
    num_cached_tokens: int = 0  # prompt tokens its last admission found cached (prefix caching)
    num_preemptions: int = 0
    detokenizer: Detokenizer | None = None  # its stop strings' detokenizer (the scheduler's, made when first needed)
    logprobs: list[TokenLogprob] = field(default_factory=list)  # one per generated token, with config.logprobs
    prompt_logprobs: list[TokenLogprob | None] = field(default_factory=list)  # per prompt token (the first None)
    constraint: OutputConstraint | None = None  # its grammar's state and logit bias (None: unconstrained)
    images: ImagePrompt | None = None  # the images its prompt shows, kept for recomputing after a preemption

    @property
    def context_len(self) -> int:
        """Tokens the target cache holds before the request decodes: its prompt, and after a preemption the tokens
        it had committed (all but the last generated one, the anchor of its next verification)."""
        return len(self.prompt) + max(len(self.generated) - 1, 0)

    def block_hashes(self, block_size: int, length: int) -> list[bytes]:
        """Chained hashes (ovbuild.runtime.cache.prefix) of the full blocks among the first `length` committed
        tokens."""
        known = self.hashes.get(block_size, [])
        if len(known) < length // block_size:
            extra = self.images.block_key if self.images is not None else None
            known = chain_hashes(self.committed(0, length), block_size, known, extra)
            self.hashes[block_size] = known
        return known[: length // block_size]

    def add_taps(self, taps: np.ndarray, start: int = 0, rows: int | None = None) -> None:
        """Keep `rows` rows of target taps from row `start` (all of them when None) for the draft: copied into the
        request's buffer of pending taps, so `taps` may be an output tensor the next call overwrites (a call's taps
        are not copied whole first), and each request holds its own rows only, not every call's whole output. One
        buffer, grown by doubling and kept across draft calls (see take_taps). Against keeping each step's rows as a
        view of its call's taps, no difference in speed showed on the losing pair (bench_runtime.py --losing, one
        and four requests, an interleaved A/B of 40 rounds: 0.973x against 0.973x and 0.971x against 0.975x of the
        target alone)."""
        end = len(taps) if rows is None else start + rows
        total = self.pending_rows + end - start
        buffer = self.pending_taps
        if buffer is None or len(buffer) < total:
            capacity = max(total, 2 * len(buffer) if buffer is not None else MIN_TAP_ROWS)
            grown = np.empty((capacity, taps.shape[1]), taps.dtype)  # [rows, taps width]
            if self.pending_rows:
                grown[: self.pending_rows] = buffer[: self.pending_rows]
            self.pending_taps = buffer = grown
        buffer[self.pending_rows : total] = taps[start:end]
        self.taps_len += total - self.pending_rows
        self.pending_rows = total

    @property
    def gap(self) -> int:
        """Committed tokens after taps_len: their taps were never taken, and the draft cannot go on until they are."""
        return self.target_len - self.taps_len

    def committed(self, start: int, end: int) -> list[int]:
        """The tokens at positions start..end-1 of the target cache (the prompt, then the generated tokens)."""
        prompt = self.prompt[start:end].tolist()
        return prompt + self.generated[max(start - len(self.prompt), 0) : max(end - len(self.prompt), 0)]

    def take_taps(self) -> np.ndarray | None:
        """All pending taps as one [rows, width] array of its own (None if there are none), now handed to the draft.
        The buffer is kept for the next ones unless it grew past KEPT_TAP_BYTES (a long prompt's, a long idle's)."""
        if not self.pending_rows:
            return None
        taps = self.pending_taps[: self.pending_rows].copy()
        self.pending_rows = 0
        if self.pending_taps.nbytes > KEPT_TAP_BYTES:
            self.pending_taps = None
        return taps

    def drop_taps(self) -> None:
        """Forget the pending taps (preempted: they are computed again when the request runs again)."""
        self.pending_taps, self.pending_rows = None, 0

    @property
    def anchor(self) -> int:
        """The last committed token: the first verification row and the draft block's first row."""
        return self.generated[-1]

    @property
    def remaining(self) -> int:
        return self.config.max_new_tokens - len(self.generated)

"""Speculative-decoding metrics, named as vLLM and OpenVINO GenAI name them."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class RequestMetrics:
    """Counters and timings of one request (or of a whole run, when summed)."""

    num_drafts: int = 0  # verification steps that checked at least one draft token
    num_draft_tokens: int = 0  # proposed tokens verified
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)  # accepted count at each draft position
    accepted_histogram: list[int] = field(default_factory=list)  # steps that accepted 0, 1, 2, ... tokens
    draft_length_histogram: list[int] = field(default_factory=list)  # decode steps that drafted 0, 1, 2, ... tokens
    num_generated_tokens: int = 0
    arrival: float = field(default_factory=time.perf_counter)
    first_token_time: float | None = None
    finish_time: float | None = None

    def record_verification(self, proposed: int, accepted: int) -> None:
        """One step's outcome: `proposed` draft tokens checked, the first `accepted` of them kept."""
        if proposed == 0:
            return
        self.num_drafts += 1
        self.num_draft_tokens += proposed
        self.num_accepted_tokens += accepted
        _grow(self.accepted_per_position, proposed)
        for i in range(accepted):
            self.accepted_per_position[i] += 1
        _grow(self.accepted_histogram, accepted + 1)
        self.accepted_histogram[accepted] += 1

    def record_draft_length(self, k: int, steps: int = 1) -> None:
        """The draft length chosen for `steps` decode steps (0: no draft for this request)."""
        _grow(self.draft_length_histogram, k + 1)
        self.draft_length_histogram[k] += steps

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens committed per verification step: 1 (the target's own token) + accepted draft tokens."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival

    @property
    def tpot(self) -> float | None:
        """Mean time per output token after the first."""
        if self.finish_time is None or self.first_token_time is None or self.num_generated_tokens < 2:
            return None
        return (self.finish_time - self.first_token_time) / (self.num_generated_tokens - 1)

    def as_dict(self) -> dict:
        return {
            "num_generated_tokens": self.num_generated_tokens,
            "num_drafts": self.num_drafts,
            "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
            "acceptance_rate": round(self.acceptance_rate, 4),
            "mean_acceptance_length": round(self.mean_acceptance_length, 4),
            "accepted_per_position": self.accepted_per_position,
            "accepted_histogram": self.accepted_histogram,
            "draft_length_histogram": self.draft_length_histogram,
            "ttft_ms": None if self.ttft is None else round(self.ttft * 1e3, 3),
            "tpot_ms": None if self.tpot is None else round(self.tpot * 1e3, 3),
        }


@dataclass
class RunMetrics:
    """Totals of a run: summed request counters and where the wall time went."""

    requests: RequestMetrics = field(default_factory=RequestMetrics)
    steps: int = 0
    target_infer_s: float = 0.0
    draft_infer_s: float = 0.0
    calibration_s: float = 0.0  # timing calls for the draft-length planner (once per pipeline, in its first step)
    wall_s: float = 0.0
    catch_up_rows: int = 0  # committed rows the target ran again for the taps it had left out (runtime.catch_up)
    # prefix caching, counted in tokens as vLLM counts them: context tokens looked up at admission, and found cached
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    num_preemptions: int = 0  # running requests sent back to the queue for lack of blocks

    def add(self, m: RequestMetrics) -> None:
        """Fold one finished request's counters into the totals."""
        r = self.requests
        r.num_drafts += m.num_drafts
        r.num_draft_tokens += m.num_draft_tokens
        r.num_accepted_tokens += m.num_accepted_tokens
        r.num_generated_tokens += m.num_generated_tokens
        for totals, part in (
            (r.accepted_per_position, m.accepted_per_position),
            (r.accepted_histogram, m.accepted_histogram),
            (r.draft_length_histogram, m.draft_length_histogram),
        ):
            _grow(totals, len(part))
            for i, v in enumerate(part):
                totals[i] += v

    def merge(self, other: RunMetrics) -> None:
        """Fold another run's totals into these (runs one after the other: times add up)."""
        self.add(other.requests)
        self.steps += other.steps
        self.target_infer_s += other.target_infer_s
        self.draft_infer_s += other.draft_infer_s
        self.calibration_s += other.calibration_s
        self.wall_s += other.wall_s
        self.catch_up_rows += other.catch_up_rows
        self.prefix_cache_queries += other.prefix_cache_queries
        self.prefix_cache_hits += other.prefix_cache_hits
        self.num_preemptions += other.num_preemptions

    @property
    def prefix_cache_hit_rate(self) -> float:
        """Share of the context tokens looked up that were found cached."""
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0

    @property
    def host_s(self) -> float:
        """Time outside the two inference calls and the calibration: scheduling, input packing, verification."""
        return max(self.wall_s - self.busy_s, 0.0)

    @property
    def busy_s(self) -> float:
        """Time inside the models: the inference calls and the calibration's timed calls."""
        return self.target_infer_s + self.draft_infer_s + self.calibration_s

    @property
    def tokens_per_second(self) -> float:
        return self.requests.num_generated_tokens / self.wall_s if self.wall_s else 0.0

    def as_dict(self) -> dict:
        d = self.requests.as_dict()
        for key in ("ttft_ms", "tpot_ms"):
            d.pop(key)
        return {
            **d,
            "steps": self.steps,
            "tokens_per_second": round(self.tokens_per_second, 2),
            "wall_ms": round(self.wall_s * 1e3, 2),
            "target_infer_ms": round(self.target_infer_s * 1e3, 2),
            "draft_infer_ms": round(self.draft_infer_s * 1e3, 2),
            "calibration_ms": round(self.calibration_s * 1e3, 2),
            "host_ms": round(self.host_s * 1e3, 2),
            "catch_up_rows": self.catch_up_rows,
            "prefix_cache_queries": self.prefix_cache_queries,
            "prefix_cache_hits": self.prefix_cache_hits,
            "prefix_cache_hit_rate": round(self.prefix_cache_hit_rate, 4),
            "num_preemptions": self.num_preemptions,
        }


def _grow(values: list[int], size: int) -> None:
    values.extend([0] * (size - len(values)))

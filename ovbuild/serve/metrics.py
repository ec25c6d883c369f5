"""Prometheus metrics of a server, named as vLLM names its own (with the `ovbuild_` prefix)."""

from __future__ import annotations

from ovbuild.errors import MissingDependencyError
from ovbuild.runtime.metrics import RunMetrics
from ovbuild.runtime.request import Request

# Seconds: TTFT spans a queue wait plus a prefill; TPOT a step of a few milliseconds to a second.
_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0)
_TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
_E2E_BUCKETS = (0.01, 0.05, 0.1, 0.3, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 60.0, 120.0)


class ServeMetrics:
    """Counters, gauges and histograms in a registry of their own (several servers can share a process)."""

    def __init__(self):
        try:
            from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
        except ImportError as e:
            raise MissingDependencyError("serving needs prometheus-client: pip install 'ovbuild[serve]'") from e
        self.registry = r = CollectorRegistry()
        self.running = Gauge("ovbuild_num_requests_running", "Requests in the running batch", registry=r)
        self.waiting = Gauge("ovbuild_num_requests_waiting", "Requests waiting for cache blocks", registry=r)
        self.drafts = Counter(
            "ovbuild_spec_decode_num_drafts", "Verification steps that checked draft tokens", registry=r
        )
        self.draft_tokens = Counter("ovbuild_spec_decode_num_draft_tokens", "Draft tokens verified", registry=r)
        self.accepted_tokens = Counter("ovbuild_spec_decode_num_accepted_tokens", "Draft tokens accepted", registry=r)
        self.accepted_per_pos = Counter(
            "ovbuild_spec_decode_num_accepted_tokens_per_pos",
            "Draft tokens accepted at each draft position (0 = the first draft token)",
            ["position"],
            registry=r,
        )
        self.prompt_tokens = Counter("ovbuild_prompt_tokens", "Prompt tokens of finished requests", registry=r)
        self.generation_tokens = Counter("ovbuild_generation_tokens", "Tokens generated", registry=r)
        self.success = Counter(
            "ovbuild_request_success", "Finished requests by finish reason", ["finished_reason"], registry=r
        )
        self.ttft = Histogram(
            "ovbuild_time_to_first_token_seconds", "Submission to first token", buckets=_TTFT_BUCKETS, registry=r
        )
        self.tpot = Histogram(
            "ovbuild_time_per_output_token_seconds",
            "Mean time per token after the first",
            buckets=_TPOT_BUCKETS,
            registry=r,
        )
        self.prefix_queries = Counter(
            "ovbuild_prefix_cache_queries", "Context tokens looked up in the prefix cache at admission", registry=r
        )
        self.prefix_hits = Counter("ovbuild_prefix_cache_hits", "Context tokens found in the prefix cache", registry=r)
        self.preemptions = Counter(
            "ovbuild_num_preemptions", "Running requests sent back to the queue for lack of blocks", registry=r
        )
        self.cache_usage = Gauge(
            "ovbuild_kv_cache_usage_perc", "Share of cache blocks requests hold (1 = full)", ["cache"], registry=r
        )
        self._totals = (0, 0, 0)  # the run totals the counters hold
        self.e2e = Histogram(
            "ovbuild_e2e_request_latency_seconds", "Submission to finish", buckets=_E2E_BUCKETS, registry=r
        )

    def queue(self, running: int, waiting: int) -> None:
        self.running.set(running)
        self.waiting.set(waiting)

    def caches(self, run: RunMetrics, usage: dict[str, float]) -> None:
        """Bring the prefix cache and preemption counters up to the run totals `run`; set each cache's usage."""
        totals = (run.prefix_cache_queries, run.prefix_cache_hits, run.num_preemptions)
        for counter, total, seen in zip(
            (self.prefix_queries, self.prefix_hits, self.preemptions), totals, self._totals, strict=True
        ):
            if total > seen:  # the run's totals only grow
                counter.inc(total - seen)
        self._totals = totals
        for name, share in usage.items():
            self.cache_usage.labels(name).set(share)

    def finished(self, request: Request, reason: str, submitted: float, first_token: float | None, now: float) -> None:
        """Count one request that left the scheduler (finished, or aborted by its client) with its finish reason."""
        m = request.metrics
        self.drafts.inc(m.num_drafts)
        self.draft_tokens.inc(m.num_draft_tokens)
        self.accepted_tokens.inc(m.num_accepted_tokens)
        for position, accepted in enumerate(m.accepted_per_position):
            self.accepted_per_pos.labels(str(position)).inc(accepted)
        self.prompt_tokens.inc(len(request.prompt))
        self.generation_tokens.inc(len(request.generated))
        self.success.labels(reason).inc()
        self.e2e.observe(now - submitted)
        if first_token is not None:
            self.ttft.observe(first_token - submitted)
            if len(request.generated) > 1:
                self.tpot.observe((now - first_token) / (len(request.generated) - 1))

    def exposition(self) -> tuple[bytes, str]:
        """(body, content type) of the Prometheus text format."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST

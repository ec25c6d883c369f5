"""Human and JSON renderings of run results and metrics."""

from __future__ import annotations

from ovbuild.runtime.metrics import RunMetrics
from ovbuild.runtime.request import Request


def format_metrics(metrics: RunMetrics, with_draft: bool) -> str:
    """A few aligned lines: throughput, time split and, with a draft, acceptance."""
    m, r = metrics, metrics.requests
    lines = [
        f"generated tokens     {r.num_generated_tokens} in {m.steps} steps, {m.wall_s * 1e3:.1f} ms "
        f"({m.tokens_per_second:.1f} tokens/s)",
        f"time split           target {m.target_infer_s * 1e3:.1f} ms, draft {m.draft_infer_s * 1e3:.1f} ms, "
        f"host {m.host_s * 1e3:.1f} ms" + (f", calibration {m.calibration_s * 1e3:.1f} ms" if m.calibration_s else ""),
    ]
    if m.prefix_cache_queries:
        lines.append(
            f"prefix cache         {m.prefix_cache_hits}/{m.prefix_cache_queries} prompt tokens cached "
            f"({m.prefix_cache_hit_rate:.1%} hit rate), {m.num_preemptions} preemptions"
        )
    if with_draft and r.num_draft_tokens:
        lines.append(
            f"acceptance           {r.num_accepted_tokens}/{r.num_draft_tokens} draft tokens "
            f"({r.acceptance_rate:.1%}), mean acceptance length {r.mean_acceptance_length:.2f}"
        )
    elif with_draft:  # said in words: an acceptance of 0/0 reads like a broken draft
        lines.append(
            "acceptance           no draft token verified, mean acceptance length 1.00: k = 0 on every step (the "
            "draft-length planner found drafting slower than the target alone; --num-assistant-tokens K pins k)"
        )
    if with_draft:
        lines += [
            f"accepted per position {r.accepted_per_position}",
            f"accepted histogram    {r.accepted_histogram}",
            f"draft length chosen   {r.draft_length_histogram} (decode steps that drafted 0, 1, 2, ... tokens)",
        ]
    return "\n".join(lines)


def results_json(prompts: list[str], requests: list[Request], metrics: RunMetrics, trace: bool) -> dict:
    """Per-request prompt, token ids, text and metrics (plus each speculative step with trace), and the totals."""
    out = []
    for prompt, request in zip(prompts, requests, strict=True):
        item = {
            "prompt": prompt,
            "generated_ids": request.generated,
            "text": request.text,
            "finish_reason": None if request.finish_reason is None else str(request.finish_reason),
            "metrics": request.metrics.as_dict(),
        }
        if trace:
            item["trace"] = request.trace
        out.append(item)
    return {"requests": out, "totals": metrics.as_dict()}

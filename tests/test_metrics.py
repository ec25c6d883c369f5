"""Speculative-decoding counters against hand-counted outcomes."""

from __future__ import annotations

from ovbuild.runtime.metrics import RequestMetrics, RunMetrics
from ovbuild.runtime.report import format_metrics


def test_verification_counters_by_position_and_histogram():
    m = RequestMetrics()
    for proposed, accepted in ((5, 2), (3, 3), (4, 0), (0, 0), (2, 1)):
        m.record_verification(proposed, accepted)
    assert (m.num_drafts, m.num_draft_tokens, m.num_accepted_tokens) == (4, 14, 6)
    # position 0 accepted in 3 steps, position 1 in 2, position 2 once (the 3/3 step); nothing beyond
    assert m.accepted_per_position == [3, 2, 1, 0, 0]
    assert m.accepted_histogram == [1, 1, 1, 1]  # one step each accepting 0, 1, 2 and 3 tokens
    assert m.acceptance_rate == 6 / 14 and m.mean_acceptance_length == 1 + 6 / 4


def test_run_totals_fold_requests_of_different_lengths():
    a, b = RequestMetrics(), RequestMetrics()
    a.record_verification(2, 2)
    b.record_verification(4, 1)
    b.num_generated_tokens = 7
    run = RunMetrics()
    run.add(a)
    run.add(b)
    totals = run.requests
    assert totals.accepted_per_position == [2, 1, 0, 0] and totals.accepted_histogram == [0, 1, 1]
    assert (totals.num_drafts, totals.num_draft_tokens, totals.num_accepted_tokens) == (2, 6, 3)
    assert totals.num_generated_tokens == 7


def test_the_report_says_in_words_when_nothing_was_drafted():
    run = RunMetrics()
    idle = RequestMetrics()
    idle.record_draft_length(0, 5)
    run.add(idle)
    text = format_metrics(run, with_draft=True)
    assert "no draft token verified" in text and "0/0" not in text and "draft length chosen   [5]" in text
    drafted = RequestMetrics()
    drafted.record_verification(4, 3)
    run.add(drafted)
    assert "3/4 draft tokens (75.0%), mean acceptance length 4.00" in format_metrics(run, with_draft=True)
    assert "acceptance" not in format_metrics(RunMetrics(), with_draft=False)


def test_prefix_cache_counters_reach_the_summary_the_json_and_merged_totals():
    run = RunMetrics(prefix_cache_queries=400, prefix_cache_hits=300, num_preemptions=2)
    assert "300/400 prompt tokens cached (75.0% hit rate), 2 preemptions" in format_metrics(run, with_draft=False)
    totals = run.as_dict()
    assert (totals["prefix_cache_queries"], totals["prefix_cache_hits"], totals["num_preemptions"]) == (400, 300, 2)
    assert totals["prefix_cache_hit_rate"] == 0.75
    both = RunMetrics()
    both.merge(run)
    both.merge(run)
    assert (both.prefix_cache_hits, both.prefix_cache_queries, both.num_preemptions) == (600, 800, 4)
    assert "prefix cache" not in format_metrics(RunMetrics(), with_draft=False)  # nothing looked up: no line

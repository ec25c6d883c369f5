"""The demo's bookkeeping and rendering, on hand-made metrics: speed-ups taken per round, their median and spread,
and the completion blocks on and off a terminal."""

from __future__ import annotations

import pytest

from ovbuild.demo import DIM, PLAIN, Comparison, Round, compare, completion_block, summary
from ovbuild.runtime.metrics import RunMetrics
from ovbuild.runtime.request import GenerationConfig, Request


def request(tokens: list[int], text: str = "") -> Request:
    r = Request(0, [1, 2], GenerationConfig(max_new_tokens=len(tokens)))
    r.generated, r.text, r.finish_reason = list(tokens), text, "length"
    return r


def metrics(tokens: int, seconds: float) -> RunMetrics:
    m = RunMetrics(wall_s=seconds)
    m.requests.num_generated_tokens = tokens
    return m


def round_of(spec_seconds: float, alone_seconds: float, tokens: list[int] = (5, 6)) -> Round:
    """100 tokens each side: the speed-up is alone_seconds / spec_seconds."""
    return Round([request(tokens)], [request(tokens)], metrics(100, spec_seconds), metrics(100, alone_seconds))


def test_speedup_is_the_median_of_per_round_ratios_and_the_median_round_is_shown():
    # ratios 2.0, 0.8, 1.25: sorted 0.8, 1.25, 2.0
    c = Comparison("one", [round_of(0.5, 1.0), round_of(1.0, 0.8), round_of(0.8, 1.0)])
    assert c.speedups == pytest.approx([2.0, 0.8, 1.25])
    assert c.speedup == pytest.approx(1.25)
    assert c.speculative_metrics.wall_s == 0.8 and c.alone_metrics.wall_s == 1.0  # the 1.25 round
    assert c.identical


def test_an_even_count_of_rounds_averages_the_middle_pair_and_shows_the_lower_one():
    c = Comparison("two", [round_of(0.5, 1.0), round_of(1.0, 1.0)])  # ratios 2.0 and 1.0
    assert c.speedup == pytest.approx(1.5)
    assert c.speculative_metrics.wall_s == 1.0  # the round with the lower middle ratio, 1.0


def test_a_round_with_other_tokens_is_not_identical():
    assert not Comparison("x", [round_of(1.0, 1.0), round_of(1.0, 1.0, tokens=[5, 7])]).identical


class TimedPipeline:
    """A pipeline whose n-th generate call takes n seconds: which calls a comparison times shows in its rounds."""

    def __init__(self):
        self.calls: list[bool] = []  # use_draft of each call

    def generate(self, batch, max_new_tokens, k, use_draft):
        self.calls.append(use_draft)
        return [request([5, 6])], metrics(100, float(len(self.calls)))


def test_a_comparison_times_its_rounds_after_an_untimed_one():
    """The first round of a way of serving runs cold (and only its first side pays): it is run, and left out."""
    pipeline = TimedPipeline()
    c = compare(pipeline, "x", [["a"]], 4, None, rounds=2)
    assert pipeline.calls == [False, True, True, False, False, True]  # the untimed round, then alternating order
    assert [(r.speculative_metrics.wall_s, r.alone_metrics.wall_s) for r in c.rounds] == [(3.0, 4.0), (6.0, 5.0)]


def test_completion_blocks_off_and_on_a_terminal():
    done = request([7, 8, 9], text="    return 1\n")
    plain = completion_block(2, "def f():\n", done, dim=False)
    assert plain == "--- prompt 2\ndef f():\n--- completion 2 (3 tokens, length)\n    return 1\n"
    terminal = completion_block(2, "def f():\n", done, dim=True)
    assert terminal == f"--- request 2 (3 tokens, length)\n{DIM}def f():\n{PLAIN}    return 1\n"


def drafting_round(spec_seconds: float, alone_seconds: float, lengths: list[int]) -> Round:
    r = round_of(spec_seconds, alone_seconds)
    r.speculative_metrics.requests.draft_length_histogram = list(lengths)
    return r


def test_where_the_planner_never_drafted_no_speed_up_is_shown():
    # the side with the draft ran faster by chance (1.25x): with k = 0 on every step that is noise, not the draft's
    c = Comparison("one request at a time", [drafting_round(0.8, 1.0, [50]), drafting_round(0.8, 1.0, [48, 2])])
    assert c.draft_lengths == [98, 2] and c.drafting_share == pytest.approx(0.02) and not c.speculation_ran
    lines = summary(c)
    assert lines[0] == "draft lengths chosen, one request at a time: k=0 98%, k=1 2% of 100 decode steps"
    assert lines[1].startswith("speculation did not run, one request at a time: the planner drafted in 2 of 100")
    assert not any("speed-up" in line and "x" in line.split("speed-up")[1][:8] for line in lines)
    assert not any("1.25x" in line for line in lines)


def test_where_the_planner_drafted_the_speed_up_comes_with_its_range_and_the_drafting_share():
    c = Comparison("4 concurrent requests", [drafting_round(0.5, 1.0, [1, 0, 0, 9]), drafting_round(0.8, 1.0, [3, 7])])
    c.rounds[0].speculative_metrics.requests.record_verification(3, 2)
    c.rounds[1].speculative_metrics.requests.record_verification(1, 1)
    assert c.draft_lengths == [4, 7, 0, 9] and c.speculation_ran
    lines = summary(c)
    assert lines[0] == "draft lengths chosen, 4 concurrent requests: k=0 20%, k=1 35%, k=3 45% of 20 decode steps"
    assert lines[1].startswith("acceptance, 4 concurrent requests: mean acceptance length 2.00")  # the 1.25x round
    assert lines[2].startswith("speed-up, 4 concurrent requests: 1.62x, median of 2 rounds (range 1.25-2.00x")
    assert lines[2].endswith("drafting in 80% of decode steps")

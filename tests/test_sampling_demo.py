"""Speculative sampling on the shipped demo pair (a draft that really accepts): the rejection rule leaves the
distribution of the first tokens that of the target alone, a deliberately broken rule does not, and the exact rule
gives the target alone's tokens seed for seed."""

from __future__ import annotations

from collections import Counter

import pytest

from ovbuild.demo import DEMO_PROMPTS
from ovbuild.runtime.decode import verify
from ovbuild.runtime.decode.sampling import race
from ovbuild.runtime.pipeline import Pipeline
from ovbuild.runtime.request import GenerationConfig

from sampling_helpers import two_sample_chi_square

pytestmark = pytest.mark.slow  # end to end: `pytest -m "not slow"` leaves it out

SEEDS = 600
accepted: dict[str, int] = {}


def first_tokens(demo_pipeline: Pipeline, use_draft: bool, rule: str, seeds: int = SEEDS) -> list[tuple[int, ...]]:
    """Tokens 1 and 2 of the first demo prompt under each seed (token 0 comes from the prefill, token 1 and 2 from
    one verification of two draft tokens), all seeds as one batch; with the draft, how many draft tokens were kept
    is in `accepted`."""
    scheduler = demo_pipeline.scheduler(use_draft=use_draft)
    prompt = demo_pipeline.encode(DEMO_PROMPTS[0])
    config = dict(do_sample=True, temperature=1.0, top_k=20, num_assistant_tokens=2, speculative_sampling=rule)
    requests = [scheduler.add_request(prompt, GenerationConfig(4, rng_seed=s, **config)) for s in range(seeds)]
    scheduler.run()
    accepted[rule] = scheduler.metrics.requests.num_accepted_tokens
    return [tuple(r.generated[1:3]) for r in requests]


def test_rejection_rule_keeps_the_distribution(demo_pipeline):
    alone, speculative = (Counter(first_tokens(demo_pipeline, d, "rejection")) for d in (False, True))
    stat, critical = two_sample_chi_square(alone, speculative)
    print(f"demo pair, rejection rule: chi-square {stat:.1f} (1e-4 critical {critical:.1f}) over {SEEDS} seeds")
    assert accepted["rejection"] > SEEDS // 4, f"only {accepted['rejection']} draft tokens accepted"
    assert stat < critical


def broken_accept_when_p_above_q(p, q, proposal, u):
    """Wrong on purpose: keeps x whenever p(x) > q(x), with no coin, and draws the bonus from p."""
    for i, x in enumerate(proposal):
        if not p[i][x] > q[i][x]:
            return [*proposal[:i], verify.draw(verify.residual(p[i], q[i]), u[i].residual)]
    return [*proposal, race(p[len(proposal)], u[len(proposal)].token)]


def test_the_same_test_fails_a_broken_rule(demo_pipeline, monkeypatch):
    alone = Counter(first_tokens(demo_pipeline, False, "rejection"))
    monkeypatch.setattr(verify, "verify_stochastic", broken_accept_when_p_above_q)
    broken = Counter(first_tokens(demo_pipeline, True, "rejection"))
    stat, critical = two_sample_chi_square(alone, broken)
    print(f"demo pair, broken rule: chi-square {stat:.1f} (1e-4 critical {critical:.1f})")
    assert stat > critical


def test_exact_rule_gives_the_target_alone_tokens_seed_for_seed(demo_pipeline):
    assert first_tokens(demo_pipeline, True, "exact", 200) == first_tokens(demo_pipeline, False, "exact", 200)

"""Sampling through the scheduler on the tiny pair: reproducible per seed, point-mass and sampled drafts under the exact
verification give the target alone's tokens, and the stochastic DFlash draft under the rejection rule leaves the
distribution of the first tokens unchanged (the tiny draft is random, so it is mostly rejected here:
tests/test_sampling.py checks the rules with a draft close to the target)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from ovbuild.runtime.model.paged_model import PagedModel
from ovbuild.runtime.request import GenerationConfig
from ovbuild.runtime.scheduler import Scheduler
from ovbuild.runtime.speculation.drafters import BlockDrafter, Proposal

from sampling_helpers import two_sample_chi_square

F32 = dict(kv_cache_precision="f32")
PROMPT = [5, 17, 33, 2, 90, 41]


class PointMassDrafter(BlockDrafter):
    """The DFlash draft with its sampled proposals handed over as plain token lists (q dropped): point masses."""

    def propose(self, items):
        proposals = super().propose(items)
        sampled = [p for p, item in zip(proposals, items, strict=True) if item.sampling is not None and p]
        assert all(isinstance(p, Proposal) for p in sampled)
        return [Proposal(p) for p in proposals]  # q dropped


def scheduler(models, drafter_class=BlockDrafter, with_draft=True, blocks: int = 64) -> Scheduler:
    target_model, draft_model = models
    drafter = drafter_class(draft_model, num_blocks=blocks, **F32) if with_draft else None
    return Scheduler(PagedModel(target_model, num_blocks=blocks, **F32), drafter, max_num_batched_tokens=4096)


def sampled(seed: int, **kw) -> GenerationConfig:
    return GenerationConfig(**{"max_new_tokens": 12, "do_sample": True, "temperature": 0.8, "rng_seed": seed, **kw})


@pytest.mark.parametrize("with_draft", [False, True], ids=["alone", "draft"])
def test_same_seed_same_tokens_alone_and_inside_a_batch(models, with_draft):
    s = scheduler(models, with_draft=with_draft)
    alone = s.add_request(PROMPT, sampled(11))
    s.run()
    s = scheduler(models, with_draft=with_draft)
    rng = np.random.default_rng(0)
    others = [s.add_request(rng.integers(0, 256, 9).tolist(), sampled(seed, top_p=0.9)) for seed in (1, 2)]
    s.add_request(PROMPT, GenerationConfig(max_new_tokens=12))  # greedy, same prompt
    s.step()
    s.step()
    inside = s.add_request(PROMPT, sampled(11))  # joins a batch already decoding
    s.run()
    assert inside.generated == alone.generated and len(alone.generated) == 12
    assert others[0].generated != others[1].generated


@pytest.mark.parametrize("drafter_class", [PointMassDrafter, BlockDrafter], ids=["point_mass", "sampled_exact"])
@pytest.mark.parametrize("k", [1, 4, None])
def test_exact_verification_gives_the_target_alone_tokens_for_the_same_seed(models, k, drafter_class):
    """Point-mass proposals, and sampled ones under the default "exact" verification: token for token the target
    alone's output for each seed, whatever K."""
    results = []
    for with_draft in (False, True):
        s = scheduler(models, drafter_class, with_draft)
        requests = [s.add_request(PROMPT, sampled(seed, num_assistant_tokens=k, top_k=20)) for seed in range(4)]
        s.run()
        results.append([r.generated for r in requests])
        if with_draft:
            assert s.metrics.requests.num_draft_tokens > 0
    assert results[0] == results[1]
    assert len({tuple(r) for r in results[0]}) == 4  # the seeds matter


def test_first_tokens_have_the_same_distribution_with_and_without_the_draft(models):
    """The "rejection" verification: 400 seeds in one batch each way; bigram of the first two tokens (the second
    verified from one sampled draft token; max_new_tokens 3 leaves room for it)."""
    samples = []
    for with_draft in (False, True):
        s = scheduler(models, with_draft=with_draft, blocks=1024)
        config = dict(
            max_new_tokens=3, top_k=4, temperature=1.5, num_assistant_tokens=1, speculative_sampling="rejection"
        )
        requests = [s.add_request(PROMPT, sampled(seed, **config)) for seed in range(400)]
        s.run()
        samples.append(Counter(tuple(r.generated[:2]) for r in requests))
        if with_draft:
            assert s.metrics.requests.num_draft_tokens == 400, s.metrics.requests
    stat, critical = two_sample_chi_square(*samples)
    assert stat < critical, f"chi-square {stat:.1f} >= {critical:.1f} over {len(samples[0] | samples[1])} bigrams"
    assert len(samples[0]) > 4  # a real distribution, not one sequence

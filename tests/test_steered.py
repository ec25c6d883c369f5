"""The steered test drafter (ovbuild.testing.steered) in accept_chance mode: it accepts each position with the chance
set, and which of its proposals are wrong belongs to the text, so every run of a text meets the same ones."""

from __future__ import annotations

import numpy as np
import pytest

from ovbuild.runtime.model.paged_model import PagedModel
from ovbuild.runtime.request import GenerationConfig
from ovbuild.runtime.scheduler import Scheduler
from ovbuild.runtime.speculation.drafters import BlockDrafter
from ovbuild.testing import TINY_TARGET
from ovbuild.testing.planner import fixed_speculation
from ovbuild.testing.steered import SteeredDrafter

F32 = dict(kv_cache_precision="f32")


def test_a_steered_draft_accepts_each_position_with_the_chance_it_is_set_to(models):
    """accept_chance a: the first wrong proposal is at position j with chance a^j (1 - a), so position j is accepted
    in a share a^(j+1) of the steps (pinned k = 7, many short requests); output equals the target alone."""
    target_model, draft_model = models
    a, config = 0.7, GenerationConfig(max_new_tokens=40, num_assistant_tokens=7)
    prompts = [list(range(s, s + 12)) for s in range(10, 250, 16)]
    alone = Scheduler(PagedModel(target_model, **F32))
    expected = [alone.add_request(p, config) for p in prompts]
    alone.run()
    drafter = SteeredDrafter(BlockDrafter(draft_model, **F32), TINY_TARGET["vocab_size"], seed=3, accept_chance=a)
    scheduler = Scheduler(PagedModel(target_model, **F32), drafter, speculation=fixed_speculation(drafter))
    requests = [scheduler.add_request(p, config) for p in prompts]
    for r, e, p in zip(requests, expected, prompts, strict=True):
        drafter.truths[r.id] = [*p, *e.generated]
    scheduler.run()
    assert [r.generated for r in requests] == [e.generated for e in expected]
    full = [c for steps in drafter.log.steps.values() for k, c in steps if k == 7]  # correct prefix per full block
    shares = [np.mean([c > j for c in full]) for j in range(3)]
    assert len(full) > 100
    assert shares == pytest.approx([a, a**2, a**3], abs=0.08), shares


def test_a_steered_draft_meets_the_same_wrong_tokens_in_every_run_of_a_text(models):
    """accept_chance: which proposals are wrong is drawn per text, not per call, as a real draft's acceptance belongs
    to the text: the same texts served in the other order (other request ids, other packing, other calls) meet the
    same wrong tokens step for step, so a benchmark's rounds differ only in time."""
    target_model, draft_model = models
    config = GenerationConfig(max_new_tokens=40, num_assistant_tokens=5)
    prompts = [list(range(s, s + 12)) for s in range(10, 120, 16)]
    alone = Scheduler(PagedModel(target_model, **F32))
    expected = [alone.add_request(p, config) for p in prompts]
    alone.run()
    truths = {tuple(p): [*p, *e.generated] for p, e in zip(prompts, expected, strict=True)}
    logs = []
    for order in (prompts, prompts[::-1]):
        drafter = SteeredDrafter(BlockDrafter(draft_model, **F32), TINY_TARGET["vocab_size"], seed=3, accept_chance=0.7)
        scheduler = Scheduler(PagedModel(target_model, **F32), drafter, speculation=fixed_speculation(drafter))
        requests = [scheduler.add_request(p, config) for p in order]
        for r, p in zip(requests, order, strict=True):
            drafter.truths[r.id] = truths[tuple(p)]
        scheduler.run()
        logs.append({tuple(p): drafter.log.steps[r.id] for r, p in zip(requests, order, strict=True)})
    assert logs[0] == logs[1]
    correct = [c for steps in logs[0].values() for _, c in steps]
    assert 0 in correct and 5 in correct, f"the steps should both miss and accept whole proposals: {correct}"

"""Penalties (repetition, presence, frequency, min_new_tokens) through the scheduler on the tiny pair: greedy tokens
equal a greedy loop over the numpy reference's logits with each penalty written out here, with and without the draft;
sampled tokens for a seed are the same with and without the draft; bad values are refused naming the field."""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np
import pytest

from ovbuild.errors import ConfigError
from ovbuild.reference.qwen3 import Qwen3Reference
from ovbuild.runtime.model.paged_model import PagedModel
from ovbuild.runtime.request import GenerationConfig
from ovbuild.runtime.scheduler import Scheduler
from ovbuild.runtime.speculation.drafters import BlockDrafter, Proposal

F32 = dict(kv_cache_precision="f32")
PROMPT = [5, 17, 33, 2, 90, 41, 5, 5, 17]
NEW = 14


def scheduler(models, with_draft: bool) -> Scheduler:
    target_model, draft_model = models
    drafter = BlockDrafter(draft_model, num_blocks=64, **F32) if with_draft else None
    return Scheduler(PagedModel(target_model, num_blocks=64, **F32), drafter, max_num_batched_tokens=4096)


def reference_greedy(ref: Qwen3Reference, prompt, config: GenerationConfig) -> list[int]:
    """Greedy decoding over the reference's logits, each penalty applied as its definition says."""
    cache, out = ref.new_cache(), []
    logits, _ = ref.forward(cache, np.array(prompt))
    while len(out) < config.max_new_tokens:
        x = logits[-1].astype(np.float64)
        for t in set(prompt) | set(out):  # repetition: over the prompt and the output
            x[t] = x[t] / config.repetition_penalty if x[t] > 0 else x[t] * config.repetition_penalty
        for t, count in Counter(out).items():  # frequency and presence: over the output
            x[t] -= config.frequency_penalty * count + config.presence_penalty
        if len(out) < config.min_new_tokens:
            x[list(config.eos_token_ids)] = -np.inf
        token = int(np.argmax(x))
        if token in config.eos_token_ids:
            break
        out.append(token)
        logits, _ = ref.forward(cache, np.array([token]))
    return out


def run(models, with_draft: bool, configs: list[GenerationConfig], prompt=PROMPT) -> list[list[int]]:
    s = scheduler(models, with_draft)
    requests = [s.add_request(prompt, c) for c in configs]
    s.run()
    if with_draft:
        assert s.metrics.requests.num_draft_tokens > 0
    return [r.generated for r in requests]


PENALTIES = {
    "repetition": dict(repetition_penalty=1.8),
    "repetition_below_1": dict(repetition_penalty=0.6),
    "presence": dict(presence_penalty=0.4),
    "frequency": dict(frequency_penalty=0.9),
    "all": dict(repetition_penalty=1.3, presence_penalty=-0.5, frequency_penalty=0.7),
}


@pytest.mark.parametrize("with_draft", [False, True], ids=["alone", "draft"])
def test_greedy_penalties_equal_a_numpy_greedy_loop(models, target, with_draft):
    ref = Qwen3Reference(*target)
    plain = GenerationConfig(max_new_tokens=NEW)
    configs = [plain] + [GenerationConfig(max_new_tokens=NEW, **kw) for kw in PENALTIES.values()]
    # min_new_tokens: the unpenalized output's 3rd token as EOS would end it after 2 tokens; held back until 8
    first = reference_greedy(ref, PROMPT, plain)
    eos = (first[2],)
    configs.append(GenerationConfig(max_new_tokens=NEW, eos_token_ids=eos, min_new_tokens=8))
    configs.append(GenerationConfig(max_new_tokens=NEW, eos_token_ids=eos, min_new_tokens=0))
    expected = [reference_greedy(ref, PROMPT, c) for c in configs]
    got = run(models, with_draft, configs)
    assert got == expected
    assert all(e != expected[0] for e in expected[1 : len(PENALTIES) + 1])  # each penalty mattered on this prompt
    assert len(expected[-1]) == 2 and len(expected[-2]) >= 8
    # repetition over the prompt: a prompt ending in the model's own continuation, whose next tokens it penalizes
    prompt = PROMPT + first[:8]
    config = GenerationConfig(max_new_tokens=6, repetition_penalty=1.8)
    expected = reference_greedy(ref, prompt, config)
    assert expected != reference_greedy(ref, PROMPT + first[:8], dataclasses.replace(config, repetition_penalty=1.0))
    assert run(models, with_draft, [config], prompt) == [expected]


class OracleDrafter(BlockDrafter):
    """Proposes the expected output itself (`answers[request id]`): every draft token is accepted, so verification
    rows after the first see the draft tokens before them in their counts."""

    def propose(self, items):
        super().propose(items)  # the draft cache takes its context rows as usual
        return [Proposal(self.answers[i.seq_id][i.position : i.position + i.num_tokens]) for i in items]


def test_rows_after_accepted_draft_tokens_count_them(models, target):
    ref = Qwen3Reference(*target)
    configs = [GenerationConfig(max_new_tokens=NEW, num_assistant_tokens=4, **kw) for kw in PENALTIES.values()]
    expected = [reference_greedy(ref, PROMPT, c) for c in configs]
    target_model, draft_model = models
    drafter = OracleDrafter(draft_model, num_blocks=64, **F32)
    s = Scheduler(PagedModel(target_model, num_blocks=64, **F32), drafter, max_num_batched_tokens=4096)
    requests = [s.add_request(PROMPT, c) for c in configs]
    drafter.answers = {r.id: e for r, e in zip(requests, expected, strict=True)}
    s.run()
    assert [r.generated for r in requests] == expected
    totals = s.metrics.requests
    assert totals.num_accepted_tokens == totals.num_draft_tokens > 2 * len(configs)


@pytest.mark.parametrize("k", [2, None])
def test_sampled_penalties_same_tokens_with_and_without_the_draft(models, k):
    configs = [
        GenerationConfig(
            max_new_tokens=NEW, do_sample=True, temperature=0.7, rng_seed=seed, num_assistant_tokens=k, **kw
        )
        for seed, kw in enumerate(PENALTIES.values())
    ]
    alone, drafted = run(models, False, configs), run(models, True, configs)
    assert alone == drafted


@pytest.mark.parametrize(
    "field, value",
    [
        ("repetition_penalty", float("nan")),
        ("repetition_penalty", 0.0),
        ("presence_penalty", 2.5),
        ("frequency_penalty", float("inf")),
        ("min_new_tokens", -1),
        ("min_new_tokens", 100),
    ],
)
def test_bad_penalties_are_refused_naming_the_field(field, value):
    with pytest.raises(ConfigError, match=field):
        GenerationConfig(max_new_tokens=10, **{field: value})

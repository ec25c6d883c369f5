"""Constrained decoding through the scheduler on the tiny pair (random weights: the output is random but constrained,
so each answer checks the grammar): greedy with the draft gives the target alone's tokens under every kind of
constraint, one request or eight with different constraints at once, with forced preemption; sampled output keeps the
constrained target's distribution; every finished JSON answer validates against its schema."""

from __future__ import annotations

import json
import re
from collections import Counter

import jsonschema
import numpy as np
import pytest

from ovbuild.reference.qwen3 import Qwen3Reference
from ovbuild.runtime.model.paged_model import PagedModel
from ovbuild.runtime.request import FinishReason, GenerationConfig
from ovbuild.runtime.scheduler import Scheduler
from ovbuild.runtime.speculation.drafters import BlockDrafter
from ovbuild.runtime.structured.grammar import Grammars
from ovbuild.runtime.structured.spec import Constraint
from ovbuild.testing import TINY_TARGET
from ovbuild.testing.planner import fixed_speculation
from ovbuild.testing.steered import SteeredDrafter
from ovbuild.testing.tokenizer import EOS_ID, write_tokenizer

from sampling_helpers import two_sample_chi_square

F32 = dict(kv_cache_precision="f32")
SCHEMA = {
    "type": "object",
    "properties": {
        "ok": {"type": "boolean"},
        "n": {"type": "integer", "minimum": 0, "maximum": 999},
        "tag": {"enum": ["red", "green", "blue"]},
    },
    "required": ["ok", "n", "tag"],
    "additionalProperties": False,
}
REGEX = r"[a-z]{3}-[0-9]{2}"
CHOICES = ["red", "green", "blue"]
GRAMMAR = 'start: "(" item ("," item)* ")"\nitem: /[0-9]/'
CONSTRAINTS = {
    "json_schema": Constraint.json_schema(SCHEMA),
    "json_object": Constraint("json_object"),
    "regex": Constraint("regex", REGEX),
    "choice": Constraint.choice(CHOICES),
    "grammar": Constraint("grammar", GRAMMAR),
}


@pytest.fixture(scope="module")
def grammars(tmp_path_factory) -> Grammars:
    folder = tmp_path_factory.mktemp("tokenizer")
    write_tokenizer(folder)
    return Grammars(folder / "tokenizer.json", (EOS_ID,), TINY_TARGET["vocab_size"])


def prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, int(rng.integers(8, 40))).tolist() for _ in range(n)]


def config(constraint: Constraint | None, bias=(), **kw) -> GenerationConfig:
    return GenerationConfig(**{"max_new_tokens": 48, "eos_token_ids": (EOS_ID,), "constraint": constraint,
                               "logit_bias": bias, **kw})  # fmt: skip


def alone(models, grammars, prompts_, configs, num_blocks: int = 256):
    s = Scheduler(PagedModel(models[0], num_blocks=num_blocks, **F32), grammars=grammars)
    requests = [s.add_request(p, c) for p, c in zip(prompts_, configs, strict=True)]
    s.run()
    return requests, s


def steered(models, grammars, prompts_, configs, expected, num_blocks: int = 256, **steer):
    drafter = SteeredDrafter(BlockDrafter(models[1], **F32), TINY_TARGET["vocab_size"], seed=2, **steer)
    target = PagedModel(models[0], num_blocks=num_blocks, **F32)
    s = Scheduler(target, drafter, speculation=fixed_speculation(drafter), grammars=grammars)
    requests = [s.add_request(p, c) for p, c in zip(prompts_, configs, strict=True)]
    for r, e, p in zip(requests, expected, prompts_, strict=True):
        drafter.truths[r.id] = [*p, *e.generated]
    s.run()
    return requests, s


def text(request) -> str:
    return bytes(t for t in request.generated if t < 256).decode("utf-8", "replace")


def check_output(kind: str, request) -> None:
    """A finished answer is in its constraint's language (one cut by max_new_tokens is a prefix of one)."""
    out = text(request)
    if request.finish_reason is not FinishReason.STOP:
        assert request.finish_reason is FinishReason.LENGTH, (kind, request.finish_reason, out)
        return
    if kind == "json_schema":
        jsonschema.validate(json.loads(out), SCHEMA)
    elif kind == "json_object":
        assert isinstance(json.loads(out), dict), out
    elif kind == "regex":
        assert re.fullmatch(REGEX, out), out
    elif kind == "choice":
        assert out in CHOICES, out
    elif kind == "grammar":
        assert re.fullmatch(r"\([0-9](,[0-9])*\)", out), out


@pytest.mark.parametrize("kind", list(CONSTRAINTS))
def test_greedy_with_the_draft_equals_the_target_alone_under_each_constraint(models, grammars, kind):
    ps = prompts(1, seed=len(kind))
    cs = [config(CONSTRAINTS[kind])]
    expected, _ = alone(models, grammars, ps, cs)
    check_output(kind, expected[0])
    got, s = steered(models, grammars, ps, cs, expected, accept_chance=0.8)
    assert [r.generated for r in got] == [e.generated for e in expected], (got[0].finish_reason, got[0].trace)
    assert got[0].finish_reason == expected[0].finish_reason
    assert s.metrics.requests.num_accepted_tokens > 0, "the draft should have been accepted some of the time"


def eight_configs() -> tuple[list[str | None], list[GenerationConfig]]:
    kinds = [*CONSTRAINTS, None, "bias", "json_schema"]
    configs = [
        config(None, ((ord("a"), 100.0), (EOS_ID, -100.0)))
        if k == "bias"
        else config(CONSTRAINTS[k] if k else None, max_new_tokens=30 if k is None else 48)
        for k in kinds
    ]
    return kinds, configs


@pytest.mark.parametrize("num_blocks", [256, 6], ids=["room", "preempted"])
def test_eight_requests_with_different_constraints_at_once(models, grammars, num_blocks):
    """Five kinds, an unconstrained request, a logit bias alone (+100 on 'a': it is all 'a'), a second schema: each
    output equals the target alone's for its request run by itself, with the draft too, also when the pool is too
    small for all of them and requests are preempted and recomputed."""
    kinds, configs = eight_configs()
    ps = prompts(8, seed=1)
    single = [alone(models, grammars, [p], [c])[0][0] for p, c in zip(ps, configs, strict=True)]
    for kind, r in zip(kinds, single, strict=True):
        if kind in CONSTRAINTS:
            check_output(kind, r)
    assert set(single[6].generated) == {ord("a")}, "a +100 bias on 'a' makes it the only token"
    batch, s1 = alone(models, grammars, ps, configs, num_blocks)
    drafted, s2 = steered(models, grammars, ps, configs, single, num_blocks, accept_chance=0.7)
    for name, run in (("alone", batch), ("draft", drafted)):
        assert [r.generated for r in run] == [r.generated for r in single], name
    if num_blocks == 6:
        assert s1.metrics.num_preemptions > 0 and s2.metrics.num_preemptions > 0


def test_every_json_schema_answer_validates(models, grammars):
    """Thirty-two prompts, the draft's proposals cut at refused tokens: each finished answer is valid JSON of the
    schema (the random model writes random values, so this checks the grammar, not the model)."""
    ps = prompts(32, seed=7)
    cs = [config(CONSTRAINTS["json_schema"], max_new_tokens=64)] * 32
    expected, _ = alone(models, grammars, ps, cs)
    got, _ = steered(models, grammars, ps, cs, expected, accept_chance=0.7)
    finished = [r for r in got if r.finish_reason is FinishReason.STOP]
    assert len(finished) >= 16, [r.finish_reason for r in got]
    for r in got:
        check_output("json_schema", r)


def test_sampled_constrained_distribution_with_and_without_the_draft(models, grammars):
    """The "rejection" verification with the draft's sampled proposals redrawn from their masked q: 400 seeds of a
    choice each way, the same distribution over the three answers (two-sample chi-square); "exact" gives the target
    alone's answer seed for seed."""
    counts = []
    for with_draft in (False, True):
        drafter = BlockDrafter(models[1], num_blocks=1024, **F32) if with_draft else None
        target = PagedModel(models[0], num_blocks=1024, **F32)
        s = Scheduler(target, drafter, max_num_batched_tokens=4096, grammars=grammars)
        c = dict(do_sample=True, temperature=1.5, num_assistant_tokens=2, speculative_sampling="rejection")
        requests = [s.add_request([5, 17, 33], config(CONSTRAINTS["choice"], rng_seed=i, **c)) for i in range(400)]
        s.run()
        outs = [text(r) for r in requests]
        assert set(outs) <= set(CHOICES) and all(r.finish_reason is FinishReason.STOP for r in requests)
        counts.append(Counter(outs))
        if with_draft:
            assert s.metrics.requests.num_draft_tokens > 0
    stat, critical = two_sample_chi_square(*counts)
    assert stat < critical, f"chi-square {stat:.1f} >= {critical:.1f}: {counts}"
    assert len(counts[0]) == 3, counts


def test_sampled_exact_verification_gives_the_target_alone_tokens(models, grammars):
    runs = []
    for with_draft in (False, True):
        drafter = BlockDrafter(models[1], **F32) if with_draft else None
        s = Scheduler(PagedModel(models[0], **F32), drafter, grammars=grammars)
        c = dict(do_sample=True, temperature=0.9, num_assistant_tokens=3)
        requests = [s.add_request(p, config(CONSTRAINTS["regex"], rng_seed=i, **c)) for i, p in enumerate(prompts(6))]
        s.run()
        runs.append([r.generated for r in requests])
    assert runs[0] == runs[1]


def test_a_grammar_that_ends_finishes_with_stop_and_the_engine_goes_on(models, grammars):
    """A choice ends the request when its grammar is complete (even without EOS among its stop tokens), next to an
    unconstrained request that runs on."""
    s = Scheduler(PagedModel(models[0], **F32), grammars=grammars)
    done = s.add_request([1, 2, 3], config(CONSTRAINTS["choice"], eos_token_ids=()))
    free = s.add_request([1, 2, 3], config(None, max_new_tokens=20))
    s.run()
    assert done.finish_reason is FinishReason.STOP and text(done) in CHOICES
    assert free.finish_reason is FinishReason.LENGTH and len(free.generated) == 20


def test_a_row_the_grammar_allows_nothing_in_ends_that_request_alone(models, grammars):
    """A dead end (a mask with no token, which llguidance never leaves unless broken: simulated here) ends its request
    with FinishReason.GRAMMAR and the tokens it had; the engine and the other request go on."""
    s = Scheduler(PagedModel(models[0], **F32), grammars=grammars)
    stuck = s.add_request([4, 5, 6], config(Constraint("regex", "q{30}")))
    free = s.add_request([4, 5, 6], config(None, max_new_tokens=10))
    stuck.constraint.mask = lambda: None
    s.run()
    assert stuck.finish_reason is FinishReason.GRAMMAR and set(stuck.generated) <= {ord("q")}
    assert free.finish_reason is FinishReason.LENGTH and len(free.generated) == 10


def test_sampled_first_token_follows_the_masked_softmax(models, grammars, target):
    """The target alone under a choice: the first token's frequencies over 600 seeds against softmax(logits / T) of
    the numpy reference restricted to the three allowed first letters (chi-square, 2 degrees of freedom, 1e-4)."""
    prompt, temperature = [5, 17, 33], 1.5
    s = Scheduler(PagedModel(models[0], num_blocks=1024, **F32), max_num_batched_tokens=4096, grammars=grammars)
    c = dict(do_sample=True, temperature=temperature, max_new_tokens=1)
    requests = [s.add_request(prompt, config(CONSTRAINTS["choice"], rng_seed=i, **c)) for i in range(600)]
    s.run()
    counts = Counter(r.generated[0] for r in requests)
    reference = Qwen3Reference(*target)
    logits, _ = reference.forward(reference.new_cache(), np.array(prompt))
    allowed = [ord("r"), ord("g"), ord("b")]
    x = logits[-1, allowed].astype(np.float64) / temperature
    expected = 600 * np.exp(x - x.max()) / np.exp(x - x.max()).sum()
    assert set(counts) <= set(allowed)
    stat = sum((counts[t] - e) ** 2 / e for t, e in zip(allowed, expected, strict=True))
    assert stat < 18.42, f"chi-square {stat:.1f} >= 18.42: counts {counts}, expected {expected.round(1)}"

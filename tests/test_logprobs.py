"""Logprobs through the scheduler on the tiny pair: each generated token's logprob and its alternatives are the
log-softmax of the target's raw logits (the numpy reference's, computed here), the same bits with and without the
draft; prompt logprobs come from the prompt's rows, also when the prompt's blocks are cached; under a grammar, from
the rows it masks."""

from __future__ import annotations

import numpy as np
import pytest

from ovbuild.errors import ConfigError
from ovbuild.reference.qwen3 import Qwen3Reference
from ovbuild.runtime import scheduler as scheduler_module
from ovbuild.runtime.model.paged_model import PagedModel
from ovbuild.runtime.request import GenerationConfig
from ovbuild.runtime.scheduler import Scheduler
from ovbuild.runtime.speculation.drafters import BlockDrafter
from ovbuild.runtime.structured.grammar import Grammars
from ovbuild.runtime.structured.spec import Constraint
from ovbuild.testing import TINY_TARGET
from ovbuild.testing.tokenizer import EOS_ID, write_tokenizer

F32 = dict(kv_cache_precision="f32")
PROMPT = [5, 17, 33, 2, 90, 41, 5, 5, 17, *range(60, 100), 3]  # longer than a cache block (16 or 32 tokens)
NEW = 10


def scheduler(models, with_draft: bool) -> Scheduler:
    target_model, draft_model = models
    drafter = BlockDrafter(draft_model, num_blocks=64, **F32) if with_draft else None
    return Scheduler(PagedModel(target_model, num_blocks=64, **F32), drafter, max_num_batched_tokens=4096)


def reference_log_softmax(ref: Qwen3Reference, tokens: list[int]) -> np.ndarray:
    """[len(tokens), V]: row i the log-probabilities of the token after tokens[: i + 1], in float64."""
    logits, _ = ref.forward(ref.new_cache(), np.array(tokens))
    x = logits.astype(np.float64)
    x -= x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_generated_logprobs_equal_the_reference_and_the_target_alone(models, target):
    configs = [
        GenerationConfig(max_new_tokens=NEW, logprobs=5),
        GenerationConfig(max_new_tokens=NEW, logprobs=0, repetition_penalty=1.5),  # raw logits: before penalties
        GenerationConfig(max_new_tokens=NEW, logprobs=3, do_sample=True, temperature=0.6, top_k=4, rng_seed=3),
    ]
    runs = []
    for with_draft in (False, True):
        s = scheduler(models, with_draft)
        requests = [s.add_request(PROMPT, c) for c in configs]
        s.add_request(PROMPT, GenerationConfig(max_new_tokens=NEW))  # no logprobs asked: none kept
        s.run()
        assert not s.finished[-1].logprobs
        runs.append(requests)
    ref = Qwen3Reference(*target)
    for alone, drafted in zip(*runs, strict=True):
        assert alone.generated == drafted.generated and alone.logprobs == drafted.logprobs  # the same bits
        lp = reference_log_softmax(ref, PROMPT + alone.generated)[len(PROMPT) - 1 : -1]
        assert [e.token for e in alone.logprobs] == alone.generated
        expected = lp[np.arange(NEW), alone.generated]
        np.testing.assert_allclose([e.logprob for e in alone.logprobs], expected, atol=1e-5)
        k = alone.config.logprobs
        for entry, row in zip(alone.logprobs, lp, strict=True):
            assert [t for t, _ in entry.top] == np.argsort(-row, kind="stable")[:k].tolist()
            np.testing.assert_allclose([v for _, v in entry.top], np.sort(row)[::-1][:k], atol=1e-5)


@pytest.mark.parametrize("with_draft", [False, True], ids=["alone", "draft"])
def test_prompt_logprobs_come_from_the_prompt_rows_even_when_its_blocks_are_cached(models, target, with_draft):
    s = scheduler(models, with_draft)
    s.add_request(PROMPT, GenerationConfig(max_new_tokens=8))
    s.run()  # the prompt's first block is now cached
    request = s.add_request(PROMPT, GenerationConfig(max_new_tokens=1, prompt_logprobs=2))
    plain = s.add_request(PROMPT, GenerationConfig(max_new_tokens=1))
    s.run()
    assert request.num_cached_tokens == 0 and plain.num_cached_tokens > 0  # the lookup skipped, not a miss
    lp = reference_log_softmax(Qwen3Reference(*target), PROMPT)
    assert request.prompt_logprobs[0] is None and len(request.prompt_logprobs) == len(PROMPT)
    got = [e.logprob for e in request.prompt_logprobs[1:]]
    np.testing.assert_allclose(got, lp[np.arange(len(PROMPT) - 1), PROMPT[1:]], atol=1e-5)
    assert [e.top[0][0] for e in request.prompt_logprobs[1:]] == lp[:-1].argmax(-1).tolist()


def test_prompt_logprobs_run_in_chunks_of_bounded_rows(models, target, monkeypatch):
    """A prompt asking for its logprobs runs in chunks of at most PROMPT_LOGPROB_ROWS rows (each row's logits are a
    whole vocabulary), whatever the token budget, and its logprobs are those of one long call."""
    monkeypatch.setattr(scheduler_module, "PROMPT_LOGPROB_ROWS", 16)
    s = scheduler(models, with_draft=False)
    calls = []
    run = s.target.run
    monkeypatch.setattr(
        s.target, "run", lambda rows, *a, **k: calls.append(sum(r.num_rows for r in rows)) or run(rows, *a, **k)
    )
    request = s.add_request(PROMPT, GenerationConfig(max_new_tokens=1, prompt_logprobs=1))
    s.run()
    assert calls[: -(-len(PROMPT) // 16)] == [16] * (len(PROMPT) // 16) + [len(PROMPT) % 16], calls
    lp = reference_log_softmax(Qwen3Reference(*target), PROMPT)
    got = [e.logprob for e in request.prompt_logprobs[1:]]
    np.testing.assert_allclose(got, lp[np.arange(len(PROMPT) - 1), PROMPT[1:]], atol=1e-5)


@pytest.mark.parametrize("field", ["logprobs", "prompt_logprobs"])
@pytest.mark.parametrize("value", [-1, 21, 1.5])
def test_bad_logprobs_are_refused_naming_the_field(field, value):
    with pytest.raises(ConfigError, match=field):
        GenerationConfig(**{field: value})


@pytest.fixture(scope="module")
def grammars(tmp_path_factory) -> Grammars:
    folder = tmp_path_factory.mktemp("tokenizer")
    write_tokenizer(folder)
    return Grammars(folder / "tokenizer.json", (EOS_ID,), TINY_TARGET["vocab_size"])


@pytest.mark.parametrize("with_draft", [False, True], ids=["alone", "draft"])
def test_constrained_logprobs_come_from_the_masked_rows(models, target, grammars, with_draft):
    """Under a grammar, a token's logprob and its alternatives are the log-softmax over the tokens the grammar allows
    there (vLLM's default: its grammar bitmask comes before its raw logprobs), still before the logit bias; forbidden
    tokens are never listed. `[a-h]{6}` allows the 8 letters a..h at every position of the byte-level tokenizer."""
    target_model, draft_model = models
    drafter = BlockDrafter(draft_model, num_blocks=64, **F32) if with_draft else None
    s = Scheduler(PagedModel(target_model, num_blocks=64, **F32), drafter, grammars=grammars)
    config = GenerationConfig(
        max_new_tokens=NEW, logprobs=12, constraint=Constraint("regex", "[a-h]{6}"), logit_bias=((ord("c"), 3.0),)
    )
    request = s.add_request(PROMPT, config)
    s.run()
    assert len(request.generated) == 6 and all(ord("a") <= t <= ord("h") for t in request.generated)
    letters, ref = np.arange(ord("a"), ord("h") + 1), Qwen3Reference(*target)
    logits, _ = ref.forward(ref.new_cache(), np.array(PROMPT + request.generated))
    for i, entry in enumerate(request.logprobs):
        row = logits[len(PROMPT) - 1 + i, letters].astype(np.float64)  # the raw row, at the allowed tokens only
        lp = row - row.max() - np.log(np.exp(row - row.max()).sum())
        np.testing.assert_allclose(entry.logprob, lp[letters == request.generated[i]][0], atol=1e-5)
        assert len(entry.top) == 8, "only the allowed tokens are listed, fewer than the 12 asked"
        order = np.lexsort((letters, -lp))
        assert [t for t, _ in entry.top] == letters[order].tolist()
        np.testing.assert_allclose([v for _, v in entry.top], lp[order], atol=1e-5)

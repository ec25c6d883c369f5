"""The OpenAI API's scoring and sampling fields through the openai client against `ovbuild serve` on the tiny pair
(f32 target cache), with and without the draft: logprobs and top_logprobs equal a numpy log-softmax of the numpy
reference's logits; echo with logprobs and max_tokens 0 gives the prompt's log-likelihood; n samples with a seed are
reproducible; penalties give a numpy greedy loop's tokens; bad values are 400s naming the field."""

from __future__ import annotations

import json
from collections import Counter

import httpx
import numpy as np
import pytest
from openai import OpenAI

from ovbuild.reference.qwen3 import Qwen3Reference
from ovbuild.runtime.pipeline import EXACT_TARGET, ModelOptions, RuntimeOptions
from ovbuild.serve.chat import ChatTemplate
from ovbuild.serve.server import BackgroundServer, build_app

pytestmark = pytest.mark.slow  # end to end: `pytest -m "not slow"` leaves it out

MODEL = "tiny"
PROMPT = "def add(a, b):\n    return"
# every step verifies draft tokens when the server has a draft (the target alone ignores the field)
DRAFTING = {"ignore_eos": True, "num_assistant_tokens": 3}
F32_TARGET = RuntimeOptions(target=ModelOptions("f32", None, EXACT_TARGET.cache_mb))


@pytest.fixture(scope="module", params=["alone", "draft"])
def server(request, tiny_pair):
    target, draft = tiny_pair
    app = build_app(target, draft if request.param == "draft" else None, F32_TARGET, name=MODEL)
    with BackgroundServer(app) as s:
        s.with_draft = request.param == "draft"
        yield s


@pytest.fixture(scope="module")
def client(server):
    return OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def reference(target):
    return Qwen3Reference(*target)


@pytest.fixture(scope="module")
def tokenizer(tiny_pair):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(tiny_pair[0] / "tokenizer.json"))


def log_softmax(ref: Qwen3Reference, ids: list[int]) -> np.ndarray:
    """[len(ids), V]: row i the log-probabilities of the token after ids[: i + 1] (numpy, float64)."""
    logits, _ = ref.forward(ref.new_cache(), np.array(ids))
    x = logits.astype(np.float64) - logits.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def token_ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False).ids


def decode(tokenizer, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=True)


def test_completion_logprobs_equal_the_reference(client, reference, tokenizer):
    prompt = token_ids(tokenizer, PROMPT)
    ids = reference_greedy(reference, prompt, 8)
    args = dict(model=MODEL, prompt=prompt, max_tokens=8, logprobs=5, extra_body=DRAFTING)
    answer = client.completions.create(**args)
    lp = answer.choices[0].logprobs
    assert lp.tokens == [decode(tokenizer, [t]) for t in ids] and answer.choices[0].text == decode(tokenizer, ids)
    rows = log_softmax(reference, prompt + ids)[len(prompt) - 1 : -1]
    np.testing.assert_allclose(lp.token_logprobs, rows[np.arange(8), ids], atol=1e-5)
    for top, row in zip(lp.top_logprobs, rows, strict=True):
        best = np.argsort(-row, kind="stable")[:5]
        expected = {decode(tokenizer, [t]): row[t] for t in best}  # tokens of one text share a key, as OpenAI's
        assert list(top) == list(expected)
        np.testing.assert_allclose(list(top.values()), list(expected.values()), atol=1e-5)
    assert lp.text_offset == np.cumsum([0] + [len(t) for t in lp.tokens[:-1]]).tolist()
    stream = client.completions.create(**args, stream=True)
    streamed = [v for c in stream if c.choices and c.choices[0].logprobs for v in c.choices[0].logprobs.token_logprobs]
    assert streamed == lp.token_logprobs


def test_completion_alternatives_hold_the_chosen_token(client, tokenizer):
    """logprobs: 0 gives each chosen token alone, and a sampled token outside the top 1 joins it (OpenAI's legacy
    completions: up to logprobs + 1 alternatives)."""
    prompt = token_ids(tokenizer, PROMPT)
    greedy = client.completions.create(model=MODEL, prompt=prompt, max_tokens=4, logprobs=0).choices[0].logprobs
    assert [list(top) for top in greedy.top_logprobs] == [[t] for t in greedy.tokens]
    assert [list(top.values()) for top in greedy.top_logprobs] == [[v] for v in greedy.token_logprobs]
    args = dict(model=MODEL, prompt=prompt, max_tokens=16, logprobs=1, temperature=2.0, seed=3)
    sampled = client.completions.create(**args).choices[0].logprobs
    outside = 0
    for token, value, top in zip(sampled.tokens, sampled.token_logprobs, sampled.top_logprobs, strict=True):
        assert token in top and 1 <= len(top) <= 2  # (tokens of one text share a key, as OpenAI's)
        if len(top) == 2:
            outside += 1
            assert top[token] == value and list(top)[1] == token  # the chosen one after the top 1
    assert outside > 0, "at temperature 2 some sampled token should fall outside the top 1"


def test_chat_logprobs_and_top_logprobs_equal_the_reference(client, reference, tokenizer, tiny_pair):
    messages = [{"role": "user", "content": "hello"}]
    text = ChatTemplate.from_folder(tiny_pair[0]).render(messages, True)
    prompt = token_ids(tokenizer, text)
    ids = reference_greedy(reference, prompt, 6)
    rows = log_softmax(reference, prompt + ids)[len(prompt) - 1 : -1]
    args = dict(model=MODEL, messages=messages, max_tokens=6, logprobs=True, top_logprobs=3)
    answer = client.chat.completions.create(**args, extra_body=DRAFTING)
    content = answer.choices[0].logprobs.content
    assert [e.token for e in content] == [decode(tokenizer, [t]) for t in ids]
    np.testing.assert_allclose([e.logprob for e in content], rows[np.arange(6), ids], atol=1e-5)
    for entry, row in zip(content, rows, strict=True):
        best = np.argsort(-row, kind="stable")[:3]
        assert [e.token for e in entry.top_logprobs] == [decode(tokenizer, [t]) for t in best]
        np.testing.assert_allclose([e.logprob for e in entry.top_logprobs], row[best], atol=1e-5)
        assert bytes(entry.bytes) == entry.token.encode()
    stream = client.chat.completions.create(**args, stream=True, extra_body=DRAFTING)
    streamed = [e.logprob for c in stream if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert streamed == [e.logprob for e in content]
    plain = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=6)
    assert plain.choices[0].logprobs is None


def test_echo_with_logprobs_and_no_new_tokens_gives_the_prompt_log_likelihood(client, reference, tokenizer):
    prompt = token_ids(tokenizer, PROMPT)
    answer = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=0, echo=True, logprobs=1)
    choice = answer.choices[0]
    assert choice.text == PROMPT and answer.usage.completion_tokens == 0
    lp = choice.logprobs
    assert lp.token_logprobs[0] is None and len(lp.token_logprobs) == len(prompt)
    rows = log_softmax(reference, prompt)
    expected = rows[np.arange(len(prompt) - 1), prompt[1:]]
    np.testing.assert_allclose(lp.token_logprobs[1:], expected, atol=1e-5)
    assert abs(sum(lp.token_logprobs[1:]) - expected.sum()) < 1e-5
    # the same prompt again, its blocks now cached: the same logprobs
    again = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=0, echo=True, logprobs=1)
    assert again.choices[0].logprobs.token_logprobs == lp.token_logprobs
    # echo without logprobs, with new tokens: the prompt then the completion, streamed the same
    plain = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4)
    echoed = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, echo=True)
    assert echoed.choices[0].text == PROMPT + plain.choices[0].text
    stream = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, echo=True, stream=True)
    chunks = [c.choices[0].text for c in stream if c.choices]
    assert chunks[0].startswith(PROMPT) and "".join(chunks) == echoed.choices[0].text


def test_n_samples_with_a_seed_are_reproducible_and_greedy_n_are_equal(server, client):
    sampled = dict(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0.9, seed=7, n=4)
    first = [c.text for c in client.completions.create(**sampled).choices]
    again = [c.text for c in client.completions.create(**sampled).choices]
    assert first == again and len(first) == 4 and len(set(first)) > 1
    # sample i draws with seed + i: sample 1 of seed 7 is sample 0 of seed 8
    shifted = client.completions.create(**{**sampled, "seed": 8, "n": 1}).choices[0].text
    assert shifted == first[1]
    # the samples of a long prompt compute it once: the others start on its cached blocks (with a draft, they do
    # once the draft cache holds them too, after a draft call took the prompt's taps: docs/serve.md)
    before = prefix_hits(client)
    client.completions.create(**{**sampled, "prompt": PROMPT * 5, "seed": 11})
    assert server.with_draft or prefix_hits(client) - before >= 3 * 32
    greedy = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, n=3)
    assert [c.index for c in greedy.choices] == [0, 1, 2] and len({c.text for c in greedy.choices}) == 1
    assert (
        greedy.usage.prompt_tokens
        == client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8).usage.prompt_tokens
    )


def prefix_hits(client) -> float:
    """The server's ovbuild_prefix_cache_hits_total."""
    text = httpx.get(str(client.base_url).replace("/v1/", "/metrics"), timeout=10).text
    return sum(
        float(line.split()[-1]) for line in text.splitlines() if line.startswith("ovbuild_prefix_cache_hits_total")
    )


def reference_greedy(ref, prompt: list[int], new: int, rep=1.0, presence=0.0, frequency=0.0) -> list[int]:
    cache, out = ref.new_cache(), []
    logits, _ = ref.forward(cache, np.array(prompt))
    while len(out) < new:
        x = logits[-1].astype(np.float64)
        for t in set(prompt) | set(out):
            x[t] = x[t] / rep if x[t] > 0 else x[t] * rep
        for t, count in Counter(out).items():
            x[t] -= frequency * count + presence
        out.append(int(np.argmax(x)))
        logits, _ = ref.forward(cache, np.array(out[-1:]))
    return out


@pytest.mark.parametrize(
    "penalties",
    [{"presence_penalty": 1.2}, {"frequency_penalty": 0.8}, {"repetition_penalty": 1.6}],
    ids=["presence", "frequency", "repetition"],
)
def test_penalties_give_the_tokens_of_a_numpy_greedy_loop(client, reference, tokenizer, penalties):
    prompt = token_ids(tokenizer, PROMPT)
    extra = {**DRAFTING, **{k: v for k, v in penalties.items() if k == "repetition_penalty"}}
    openai_fields = {k: v for k, v in penalties.items() if k != "repetition_penalty"}
    answer = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, extra_body=extra, **openai_fields)
    expected = reference_greedy(
        reference,
        prompt,
        12,
        penalties.get("repetition_penalty", 1.0),
        penalties.get("presence_penalty", 0.0),
        penalties.get("frequency_penalty", 0.0),
    )
    assert expected != reference_greedy(reference, prompt, 12)  # the penalty matters on this prompt
    assert answer.choices[0].text == decode(tokenizer, expected)


@pytest.mark.parametrize(
    ("url", "body", "param"),
    [
        ("completions", {"prompt": "x", "n": -1}, "n"),
        ("completions", {"prompt": "x", "logprobs": 21}, "logprobs"),
        ("completions", {"prompt": "x", "max_tokens": 0}, "max_tokens"),
        ("completions", {"prompt": "x", "min_tokens": 50, "max_tokens": 5}, "min_tokens"),
        ("chat/completions", {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 21}, "top_logprobs"),
        ("chat/completions", {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, "top_logprobs"),
    ],
)
def test_bad_values_are_400s_naming_the_field(server, url, body, param):
    answer = httpx.post(f"{server.url}/v1/{url}", json={"model": MODEL, **body}, timeout=10)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == param


@pytest.mark.parametrize("field", ["presence_penalty", "frequency_penalty", "repetition_penalty"])
def test_a_nan_penalty_is_a_400_naming_the_field(server, field):
    body = json.dumps({"model": MODEL, "prompt": "x", field: float("nan")})  # NaN: not strict JSON, as clients send it
    answer = httpx.post(f"{server.url}/v1/completions", content=body, headers={"content-type": "application/json"})
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == field

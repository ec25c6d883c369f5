"""`ovbuild serve` on the tiny exported pair, through the official openai client and raw HTTP: outputs equal the
target alone, streaming and not; errors are OpenAI-shaped 400 / 503 bodies; /metrics counts what was sent."""

from __future__ import annotations

import json
import re
import time

import httpx
import pytest
from openai import OpenAI

from ovbuild.runtime.pipeline import Pipeline
from ovbuild.serve.server import BackgroundServer, build_app

pytestmark = pytest.mark.slow  # end to end: `pytest -m "not slow"` leaves it out

PROMPTS = ["def add(a, b):", "import os\n", "class Stack:"]
MAX_TOKENS = 10
MODEL = "tiny"


@pytest.fixture(scope="module")
def server(tiny_pair):
    with BackgroundServer(build_app(*tiny_pair, name=MODEL)) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def alone(tiny_pair):
    """The target alone, in-process: what every greedy answer must equal."""
    pipeline = Pipeline(tiny_pair[0])
    requests, _ = pipeline.generate(PROMPTS, MAX_TOKENS, use_draft=False)
    return pipeline, requests


def metrics(server) -> dict[str, float]:
    """The Prometheus samples as {name{labels}: value}."""
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def wait_idle(server, timeout: float = 10.0) -> dict:
    """/health once the engine holds no request (aborts are applied between steps)."""
    deadline = time.monotonic() + timeout
    while True:
        health = httpx.get(f"{server.url}/health", timeout=10).json()
        if (health["outstanding"] == 0 and health["running"] == 0) or time.monotonic() > deadline:
            return health
        time.sleep(0.02)


def test_the_app_says_how_the_device_compiled_the_models(server):
    """`ovbuild serve` logs it at start: device, math and KV cache of the target and of the draft."""
    runtime = server.server.config.app.state.runtime
    assert re.fullmatch(
        r"target CPU, \w+ math( \(\w+ asked\))?, \w+ KV cache; draft CPU, \w+ math, u8 KV cache", runtime
    )


def test_completions_equal_the_target_alone(client, alone):
    _, expected = alone
    for prompt, request in zip(PROMPTS, expected, strict=True):
        answer = client.completions.create(model=MODEL, prompt=prompt, max_tokens=MAX_TOKENS)
        assert answer.choices[0].text == request.text
        assert answer.choices[0].finish_reason == "length"
        assert answer.usage.completion_tokens == len(request.generated) == MAX_TOKENS
        assert answer.usage.prompt_tokens == len(request.prompt)


def test_streamed_completions_concatenate_to_the_same_text(client, alone):
    _, expected = alone
    for prompt, request in zip(PROMPTS, expected, strict=True):
        chunks = list(
            client.completions.create(
                model=MODEL, prompt=prompt, max_tokens=MAX_TOKENS, stream=True, stream_options={"include_usage": True}
            )
        )
        pieces = [c.choices[0].text for c in chunks if c.choices]
        assert "".join(pieces) == request.text
        assert len([p for p in pieces if p]) > 1, "the text came in one piece: not streamed"
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
        assert chunks[-1].usage.completion_tokens == MAX_TOKENS


def test_one_request_with_token_id_prompts_and_text_prompts(client, alone):
    pipeline, expected = alone
    ids = [pipeline.encode(p) for p in PROMPTS[:2]]
    answer = client.completions.create(model=MODEL, prompt=ids, max_tokens=MAX_TOKENS)
    assert [c.text for c in sorted(answer.choices, key=lambda c: c.index)] == [r.text for r in expected[:2]]
    single = client.completions.create(model=MODEL, prompt=ids[0], max_tokens=MAX_TOKENS)
    assert [c.text for c in single.choices] == [expected[0].text]


def test_chat_renders_the_template_and_equals_the_target_on_that_prompt(client, alone):
    pipeline, _ = alone
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "héllo"}]
    # the tiny target's ChatML template, written out by hand
    prompt = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhéllo<|im_end|>\n<|im_start|>assistant\n"
    (request,), _ = pipeline.generate(prompt, MAX_TOKENS, use_draft=False)
    answer = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=MAX_TOKENS)
    assert answer.choices[0].message.role == "assistant"
    assert answer.choices[0].message.content == request.text
    assert answer.usage.prompt_tokens == len(pipeline.encode(prompt))
    stream = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=MAX_TOKENS, stream=True)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == request.text
    assert chunks[-1].choices[0].finish_reason == "length"


def test_stop_strings_cut_the_text_as_the_runtime_does(client, alone):
    pipeline, expected = alone
    stop = pipeline.decode(expected[0].generated[4:6])
    assert stop and stop in expected[0].text
    cut = expected[0].text[: expected[0].text.find(stop)]
    answer = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=MAX_TOKENS, stop=[stop])
    assert (answer.choices[0].text, answer.choices[0].finish_reason) == (cut, "stop")
    stream = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=MAX_TOKENS, stop=stop, stream=True)
    assert "".join(c.choices[0].text for c in stream) == cut


def test_models_and_health(server):
    models = httpx.get(f"{server.url}/v1/models", timeout=10).json()
    assert [m["id"] for m in models["data"]] == [MODEL]
    health = httpx.get(f"{server.url}/health", timeout=10)
    assert health.status_code == 200 and health.json()["status"] == "ok"


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        ({"prompt": "x", "max_tokens": 0}, "max_tokens", "max_tokens = 0 needs echo"),
        ({"prompt": "x", "max_tokens": "many"}, "max_tokens", "valid integer"),
        ({"prompt": "x", "max_tokens": 5000}, "max_tokens", "maximum context length is 4096"),
        ({"prompt": [1] * 4096}, "prompt", "maximum context length is 4096"),
        ({"prompt": [1, 99999]}, "prompt", "token id 99999 is outside the vocabulary"),
        ({"prompt": "x", "temperature": 0.8, "top_p": 1.5}, "top_p", "less than or equal to 1"),
        ({"prompt": "x", "n": 0}, "n", "greater than or equal to 1"),
        ({"prompt": "x", "stream": "sometimes"}, "stream", "valid boolean"),
        ({"max_tokens": 3}, "prompt", "Field required"),
    ],
)
def test_invalid_completion_requests_get_openai_style_400(server, body, param, message):
    answer = httpx.post(f"{server.url}/v1/completions", json={"model": MODEL, **body}, timeout=10)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert message in error["message"]


def test_greedy_compatible_sampling_fields_are_accepted(client, alone):
    _, expected = alone
    # top_k is not an OpenAI field: the client sends it in extra_body, as vLLM users do
    for extra in ({"temperature": 0}, {"temperature": 0.7, "extra_body": {"top_k": 1}}, {"top_p": 0.9, "seed": 3}):
        answer = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=MAX_TOKENS, **extra)
        assert answer.choices[0].text == expected[0].text


def test_sampling_requests_are_reproducible_and_equal_the_pipeline(client, alone):
    """temperature > 0 samples with GenAI's processing; a seed makes the answer the pipeline's for that seed."""
    pipeline, _ = alone
    sampling = dict(do_sample=True, temperature=0.9, top_k=0, top_p=0.95, rng_seed=11)
    (expected,), _ = pipeline.generate([PROMPTS[0]], MAX_TOKENS, use_draft=False, **sampling)
    answers = [
        client.completions.create(
            model=MODEL, prompt=PROMPTS[0], max_tokens=MAX_TOKENS, temperature=0.9, top_p=0.95, seed=11
        )
        .choices[0]
        .text
        for _ in range(2)
    ]
    assert answers == [expected.text, expected.text]


def test_invalid_chat_requests_get_400(server):
    url = f"{server.url}/v1/chat/completions"
    refused = httpx.post(url, json={"model": MODEL, "messages": [{"role": "robot", "content": "x"}]}, timeout=10)
    assert refused.status_code == 400
    assert "unknown role: robot" in refused.json()["error"]["message"]
    empty = httpx.post(url, json={"model": MODEL, "messages": []}, timeout=10)
    assert empty.status_code == 400 and empty.json()["error"]["param"] == "messages"
    image = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
    assert httpx.post(url, json={"model": MODEL, "messages": [image]}, timeout=10).status_code == 400
    assert httpx.post(url, content=b"{not json", timeout=10).status_code == 400


def test_a_client_that_disconnects_frees_its_blocks_at_once(server):
    before = metrics(server)
    body = {"model": MODEL, "prompt": "x", "max_tokens": 3000, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=30) as answer:
        lines = answer.iter_lines()
        assert next(lines).startswith("data: ")
    start = time.monotonic()
    health = wait_idle(server)
    assert time.monotonic() - start < 5, "the aborted request kept running"
    assert health["free_blocks"] == health["total_blocks"]
    after = metrics(server)
    key = 'ovbuild_request_success_total{finished_reason="abort"}'
    assert after[key] - before.get(key, 0) == 1
    generated = after["ovbuild_generation_tokens_total"] - before["ovbuild_generation_tokens_total"]
    assert 0 < generated < 3000


def test_metrics_count_the_requests_sent(server, client):
    wait_idle(server)
    before = metrics(server)
    # the draft length pinned: left to the adaptive choice, the tiny random draft (which accepts nothing) soon stops
    # being asked at all
    pinned = {"extra_body": {"num_assistant_tokens": 3}}
    answers = [client.completions.create(model=MODEL, prompt=p, max_tokens=MAX_TOKENS, **pinned) for p in PROMPTS]
    chat = [{"role": "user", "content": "hi"}]
    answers.append(client.chat.completions.create(model=MODEL, messages=chat, max_tokens=MAX_TOKENS, **pinned))
    after = metrics(server)

    def delta(name):
        return after.get(name, 0) - before.get(name, 0)

    finished = sum(delta(k) for k in after if k.startswith("ovbuild_request_success_total"))
    assert finished == len(answers)
    assert delta("ovbuild_generation_tokens_total") == sum(a.usage.completion_tokens for a in answers)
    assert delta("ovbuild_prompt_tokens_total") == sum(a.usage.prompt_tokens for a in answers)
    assert delta("ovbuild_time_to_first_token_seconds_count") == len(answers)
    assert delta("ovbuild_e2e_request_latency_seconds_count") == len(answers)
    assert delta("ovbuild_spec_decode_num_drafts_total") > 0, "the draft never ran"
    assert delta("ovbuild_spec_decode_num_draft_tokens_total") >= delta("ovbuild_spec_decode_num_accepted_tokens_total")
    assert after["ovbuild_num_requests_running"] == 0 and after["ovbuild_num_requests_waiting"] == 0


def test_a_full_server_answers_503_and_recovers(tiny_pair):
    with BackgroundServer(build_app(tiny_pair[0], name=MODEL, max_requests=1)) as server:
        url = f"{server.url}/v1/completions"
        body = {"model": MODEL, "prompt": "x", "max_tokens": 3000, "stream": True, "ignore_eos": True}
        with httpx.stream("POST", url, json=body, timeout=30) as answer:
            lines = answer.iter_lines()  # held: a dropped iterator closes the response
            assert next(lines).startswith("data: ")
            busy = httpx.post(url, json={"model": MODEL, "prompt": "y", "max_tokens": 2}, timeout=10)
            assert busy.status_code == 503
            assert busy.json()["error"]["code"] == "overloaded" and busy.headers["retry-after"] == "1"
        wait_idle(server)
        again = httpx.post(url, json={"model": MODEL, "prompt": "y", "max_tokens": 2}, timeout=30)
        assert again.status_code == 200 and json.loads(again.text)["usage"]["completion_tokens"] == 2


def test_a_multi_turn_chat_hits_the_prefix_cache(server, client):
    """Each turn resends the whole conversation: from the second turn on, its prefix is found cached, as /metrics
    counts (tokens looked up and found, vLLM's counters), and the cache usage gauge is there for both caches."""
    wait_idle(server)
    before = metrics(server)
    messages = [
        {"role": "system", "content": "You are a terse assistant who answers in code. " * 8},
        {"role": "user", "content": "def add(a, b):"},
    ]
    prompt_tokens = 0
    for turn in range(3):
        answer = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8)
        prompt_tokens += answer.usage.prompt_tokens
        messages += [
            {"role": "assistant", "content": answer.choices[0].message.content},
            {"role": "user", "content": f"and turn {turn}?"},
        ]
    wait_idle(server)
    after = metrics(server)

    def delta(name):
        return after.get(name, 0) - before.get(name, 0)

    assert delta("ovbuild_prefix_cache_queries_total") == prompt_tokens
    assert 0 < delta("ovbuild_prefix_cache_hits_total") < prompt_tokens
    for cache in ("target", "draft"):
        assert 0 <= after[f'ovbuild_kv_cache_usage_perc{{cache="{cache}"}}'] <= 1
    assert "ovbuild_num_preemptions_total" in after

"""What third-party clients met when they used `ovbuild serve`, through the official openai client and one keep-alive
httpx.Client on the tiny pair (and the trained demo pair for chat and acceptance): a stop string at the very start,
a non-streaming client that leaves, out-of-range seeds, more choices than the server holds, the model and tokenizer
endpoints, model names and aliases, and every error in OpenAI's shape on a connection that stays open."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest
from openai import OpenAI

from ovbuild.serve.chat import ChatTemplate
from ovbuild.serve.server import BackgroundServer, build_app

pytestmark = pytest.mark.slow  # end to end: `pytest -m "not slow"` leaves it out

MODEL = "tiny"
ALIASES = [MODEL, "./exported/target/", "tiny-alias"]
PROMPT = "def fib(n):"


@pytest.fixture(scope="module")
def server(tiny_pair):
    with BackgroundServer(build_app(*tiny_pair, name=ALIASES, max_requests=256, spec_decode_stats=True)) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def tokenizer(tiny_pair):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(tiny_pair[0] / "tokenizer.json"))


def metrics(url: str) -> dict[str, float]:
    """The Prometheus samples as {name{labels}: value}."""
    out = {}
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def wait_idle(url: str, timeout: float = 10.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        health = httpx.get(f"{url}/health", timeout=10).json()
        if (health["outstanding"] == 0 and health["running"] == 0) or time.monotonic() > deadline:
            return health
        time.sleep(0.02)


def local_port(answer: httpx.Response):
    """The client side of the connection an answer came on: the same port, the same keep-alive connection."""
    return answer.extensions["network_stream"].get_extra_info("client_addr")


def assert_openai_error(answer: httpx.Response, status: int, kind: str, param=None, code=None) -> dict:
    assert answer.status_code == status, answer.text
    body = answer.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    error = body["error"]
    assert (error["type"], error["param"], error["code"]) == (kind, param, code), error
    return error


# -- a stop string at the very start of the output -------------------------------------------------------------------


def test_a_stop_string_that_starts_the_completion_gives_empty_text(client):
    plain = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, extra_body={"ignore_eos": True})
    stop = plain.choices[0].text[:1]
    assert stop, "the target's completion is empty"
    answer = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, stop=stop)
    assert (answer.choices[0].text, answer.choices[0].finish_reason) == ("", "stop")
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, stop=[stop], stream=True))
    assert "".join(c.choices[0].text for c in chunks) == ""
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_a_stop_string_that_starts_the_chat_answer_gives_empty_content(client):
    messages = [{"role": "user", "content": PROMPT}]
    plain = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, extra_body={"ignore_eos": 1})
    stop = plain.choices[0].message.content[:1]
    assert stop, "the target's answer is empty"
    answer = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, stop=stop)
    assert (answer.choices[0].message.content, answer.choices[0].finish_reason) == ("", "stop")
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, stop=stop, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == ""
    assert chunks[-1].choices[0].finish_reason == "stop"


# -- a client that leaves ---------------------------------------------------------------------------------------------


def test_a_non_streaming_client_that_leaves_is_aborted_at_once(server):
    wait_idle(server.url)
    before = metrics(server.url)
    body = {"model": MODEL, "prompt": "x", "max_tokens": 4000, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.url}/v1/completions", json=body, timeout=0.3)
    left = time.monotonic()
    health = wait_idle(server.url)
    assert time.monotonic() - left < 3, "the request of the client that left kept running"
    assert health["free_blocks"] == health["total_blocks"]
    after = metrics(server.url)
    key = 'ovbuild_request_success_total{finished_reason="abort"}'
    assert after[key] - before.get(key, 0) == 1
    assert after.get('ovbuild_request_success_total{finished_reason="length"}') == before.get(
        'ovbuild_request_success_total{finished_reason="length"}'
    )
    generated = after["ovbuild_generation_tokens_total"] - before["ovbuild_generation_tokens_total"]
    assert 0 < generated < 4000


# -- bad values keep one clear error and the connection -------------------------------------------------------------


def test_out_of_range_seeds_are_400s_and_the_connection_stays_open(server):
    url = f"{server.url}/v1/completions"
    sampling = {"model": MODEL, "prompt": "x", "max_tokens": 2, "temperature": 0.8}
    with httpx.Client(timeout=30) as http:
        first = http.post(url, json={**sampling, "seed": 1})
        assert first.status_code == 200, first.text
        for seed, n in ((2**64, 1), (2**64 - 1, 2), (-1, 1), (2**70, 1)):
            refused = http.post(url, json={**sampling, "seed": seed, "n": n})
            error = assert_openai_error(refused, 400, "invalid_request_error", "seed")
            assert "[0, 2**64 - n]" in error["message"]
            assert local_port(refused) == local_port(first), "the server closed the keep-alive connection"
        edge = http.post(url, json={**sampling, "seed": 2**64 - 2, "n": 2})
        assert edge.status_code == 200 and len(edge.json()["choices"]) == 2
        assert local_port(edge) == local_port(first)


def test_more_choices_than_the_server_holds_are_a_400_not_a_503(client):
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model=MODEL, prompt=["a", "b", "c"], max_tokens=1, n=128)
    assert refused.value.body["param"] == "n" and "at most 256" in refused.value.body["message"]
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model=MODEL, prompt=["a"] * 300, max_tokens=1)
    assert refused.value.body["param"] == "prompt"
    assert client.completions.create(model=MODEL, prompt="a", max_tokens=1).choices[0].finish_reason == "length"


def test_errors_are_openai_shaped_on_one_keep_alive_connection(server):
    with httpx.Client(base_url=server.url, timeout=30) as http:
        first = http.get("/v1/models")
        missing = http.get("/v1/nowhere")
        assert_openai_error(missing, 404, "not_found_error")
        wrong_method = http.get("/v1/completions")
        assert_openai_error(wrong_method, 405, "invalid_request_error")
        assert "POST" in wrong_method.headers["allow"]
        bad_json = http.post("/v1/completions", content=b'{"model": "tiny", "prompt": ', headers=_JSON)
        error = assert_openai_error(bad_json, 400, "invalid_request_error")
        assert error["message"].startswith("the request body is not valid JSON (")
        unknown = http.post("/v1/completions", json={"model": "gpt-4", "prompt": "x"})
        error = assert_openai_error(unknown, 404, "invalid_request_error", "model", "model_not_found")
        assert (
            error["message"] == "the model 'gpt-4' does not exist (this server serves 'tiny', 'exported/target', "
            "'tiny-alias')"
        )
        model = server.server.config.app.state.model
        encode = model.encode
        model.encode = _broken_encode  # a fault of the server itself, not of the request
        try:
            failed = http.post("/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 1})
        finally:
            model.encode = encode
        error = assert_openai_error(failed, 500, "server_error")
        assert "RuntimeError: the tokenizer broke" in error["message"]
        fine = http.post("/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 1})
        assert fine.status_code == 200
        answers = (missing, wrong_method, bad_json, unknown, failed, fine)
        assert {local_port(a) for a in answers} == {local_port(first)}, "an error closed the keep-alive connection"


_JSON = {"content-type": "application/json"}


def _broken_encode(text: str) -> list[int]:
    raise RuntimeError("the tokenizer broke")


# -- models, names and the tokenizer endpoints ------------------------------------------------------------------------


def test_models_list_and_retrieve_every_name(client):
    cards = client.models.list().data
    assert [c.id for c in cards] == ["tiny", "exported/target", "tiny-alias"]
    for card in cards:
        assert card.created > 1_700_000_000 and card.owned_by == "ovbuild"
        assert card.model_extra["max_model_len"] == 4096
    assert client.models.retrieve("./exported/target").id == "exported/target"
    assert client.models.retrieve("tiny-alias").model_extra["max_model_len"] == 4096
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve("gpt-4")
    assert missing.value.body["code"] == "model_not_found"


def test_every_alias_and_spelling_names_one_model(client):
    texts = set()
    for name in ("tiny", "tiny-alias", "exported/target", "./exported/target", "exported//target/"):
        answer = client.completions.create(model=name, prompt=PROMPT, max_tokens=4)
        texts.add(answer.choices[0].text)
        assert answer.model in ("tiny", "tiny-alias", "exported/target")
    assert len(texts) == 1
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="other", messages=[{"role": "user", "content": "x"}], max_tokens=1)
    assert missing.value.body["code"] == "model_not_found"


def test_tokenize_detokenize_and_tokenizer_info_as_vllm_answers(server, tokenizer, tiny_pair):
    with httpx.Client(base_url=server.url, timeout=30) as http:
        text = "def add(a, b):\n    return a + b"
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        answer = http.post("/tokenize", json={"prompt": text, "add_special_tokens": False}).json()
        assert answer == {"count": len(ids), "max_model_len": 4096, "tokens": ids, "token_strs": None}
        strs = http.post("/tokenize", json={"model": MODEL, "prompt": text, "return_token_strs": True}).json()
        assert strs["token_strs"] == [tokenizer.decode([t]) for t in ids]
        messages = [{"role": "user", "content": "hello"}]
        chat = http.post("/tokenize", json={"model": MODEL, "messages": messages}).json()
        rendered = ChatTemplate.from_folder(tiny_pair[0]).render(messages, True)
        assert chat["tokens"] == tokenizer.encode(rendered, add_special_tokens=False).ids
        assert http.post("/detokenize", json={"tokens": ids}).json() == {"prompt": text}
        eos = tokenizer.token_to_id("<|endoftext|>")
        assert http.post("/detokenize", json={"model": MODEL, "tokens": [eos]}).json() == {"prompt": "<|endoftext|>"}
        refused = http.post("/detokenize", json={"tokens": [10**6]})
        assert_openai_error(refused, 400, "invalid_request_error", "tokens")
        assert_openai_error(
            http.post("/tokenize", json={"model": "x", "prompt": "a"}),
            404,
            "invalid_request_error",
            "model",
            "model_not_found",
        )
        info = http.get("/tokenizer_info").json()
        assert info["tokenizer_class"] and info["eos_token"] == "<|endoftext|>"
        assert info["chat_template"] == ChatTemplate.from_folder(tiny_pair[0]).source
        assert info["model_max_length"] == 4096
        assert http.get("/version").json()["version"]


# -- per-request speculative decoding stats --------------------------------------------------------------------------


def test_each_choice_reports_its_speculative_decoding(client):
    args = dict(
        model=MODEL, prompt=PROMPT, max_tokens=12, n=2, extra_body={"ignore_eos": True, "num_assistant_tokens": 3}
    )
    answer = client.completions.create(**args)
    for choice in answer.choices:
        check_stats(choice.model_extra["speculative_decoding_stats"])
    chunks = list(client.completions.create(**args, stream=True))
    last = [c.choices[0] for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(last) == 2
    for choice in last:
        check_stats(choice.model_extra["speculative_decoding_stats"])


def check_stats(stats: dict) -> None:
    """vLLM's fields, consistent among themselves."""
    steps, accepted = stats["num_spec_steps"], stats["num_accepted_draft_tokens"]
    assert steps > 0, "the draft never ran"
    assert sum(stats["acceptance_histogram"].values()) == steps
    assert sum(int(j) * c for j, c in stats["acceptance_histogram"].items()) == accepted
    assert stats["mean_acceptance_length"] == pytest.approx(1 + accepted / steps)
    assert stats["draft_acceptance_rate"] == pytest.approx(accepted / stats["num_draft_tokens"])
    assert stats["num_spec_tokens"] == 3 and sum(stats["num_accepted_tokens_per_pos"]) == accepted


# -- the shipped demo pair: chat, and acceptance per position ---------------------------------------------------------


@pytest.fixture(scope="module")
def demo_server(demo_pair):
    with BackgroundServer(build_app(*demo_pair, name="demo", spec_decode_stats=True)) as s:
        yield s


def test_the_demo_pair_chats_through_the_openai_client(demo_server):
    client = OpenAI(base_url=f"{demo_server.url}/v1", api_key="unused", max_retries=0, timeout=60)
    messages = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "def add(a, b):"}]
    answer = client.chat.completions.create(model="demo", messages=messages, max_tokens=16)
    assert answer.choices[0].message.role == "assistant" and answer.choices[0].message.content
    assert answer.usage.prompt_tokens == len(
        httpx.post(f"{demo_server.url}/tokenize", json={"messages": messages}, timeout=10).json()["tokens"]
    )
    stream = client.chat.completions.create(model="demo", messages=messages, max_tokens=16, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == answer.choices[0].message.content


def test_metrics_count_accepted_tokens_per_draft_position(demo_server):
    wait_idle(demo_server.url)
    before = metrics(demo_server.url)
    body = {"model": "demo", "prompt": "def fibonacci(n):\n", "max_tokens": 48, "num_assistant_tokens": 4}
    answer = httpx.post(f"{demo_server.url}/v1/completions", json=body, timeout=60).json()
    stats = answer["choices"][0]["speculative_decoding_stats"]
    after = metrics(demo_server.url)

    def delta(name):
        return after.get(name, 0) - before.get(name, 0)

    per_pos = [delta(f'ovbuild_spec_decode_num_accepted_tokens_per_pos_total{{position="{i}"}}') for i in range(4)]
    assert per_pos == stats["num_accepted_tokens_per_pos"]
    assert sum(per_pos) == delta("ovbuild_spec_decode_num_accepted_tokens_total") == stats["num_accepted_draft_tokens"]
    assert per_pos[0] > 0, "the trained draft accepted nothing"
    assert per_pos == sorted(per_pos, reverse=True), "a later position accepted more than an earlier one"
    assert json.dumps(stats)  # plain JSON values

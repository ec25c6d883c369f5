"""`from ovbuild import LLM` and the `generate` CLI's token-id prompts, --ignore-eos, --chat and per-request
streaming, on the tiny exported pair; every answer is checked against the target alone through Pipeline."""

from __future__ import annotations

import json
import re
import shutil

import pytest

from ovbuild import LLM
from ovbuild.cli import main
from ovbuild.errors import ConfigError, RequestError
from ovbuild.runtime.pipeline import Pipeline
from ovbuild.testing.tokenizer import EOS_ID

PROMPTS = ["def add(a, b):", "import os\n", "x = "]


@pytest.fixture(scope="module")
def llm(tiny_pair):
    return LLM(*tiny_pair)


@pytest.fixture(scope="module")
def alone(tiny_pair):
    """Pipeline, and its requests for PROMPTS with the target alone (10 new tokens)."""
    pipeline = Pipeline(tiny_pair[0])
    return pipeline, pipeline.generate(PROMPTS, 10, use_draft=False)[0]


def test_a_string_gives_a_string_and_a_list_gives_a_list(llm, alone):
    _, expected = alone
    assert llm.generate(PROMPTS[0], max_new_tokens=10) == expected[0].text
    assert llm.generate(PROMPTS, max_new_tokens=10) == [r.text for r in expected]


def test_token_id_prompts_one_or_many(llm, alone):
    pipeline, expected = alone
    ids = [pipeline.encode(p) for p in PROMPTS]
    assert llm.generate(ids[0], max_new_tokens=10) == expected[0].text  # list[int]: one prompt, not a batch
    assert llm.generate(ids, max_new_tokens=10) == [r.text for r in expected]
    assert llm.generate([ids[0], PROMPTS[1]], max_new_tokens=10) == [r.text for r in expected[:2]]


def test_pipeline_takes_a_string_as_one_prompt(alone):
    pipeline, expected = alone
    requests, _ = pipeline.generate(PROMPTS[0], 10, use_draft=False)
    assert [r.generated for r in requests] == [expected[0].generated]


def test_streamer_gets_the_text_in_pieces_and_can_stop(llm, alone):
    _, expected = alone
    pieces: list[str] = []
    assert llm.generate(PROMPTS[0], max_new_tokens=10, streamer=pieces.append) == expected[0].text
    assert "".join(pieces) == expected[0].text and len(pieces) > 1
    indexed: list[tuple[int, str]] = []
    llm.generate(PROMPTS, max_new_tokens=10, streamer=lambda i, text: indexed.append((i, text)))
    for i, request in enumerate(expected):
        assert "".join(t for j, t in indexed if j == i) == request.text
    stopped = llm.generate(PROMPTS[0], max_new_tokens=10, streamer=lambda text: True)  # stop after the first piece
    assert stopped and expected[0].text.startswith(stopped) and len(stopped) < len(expected[0].text)
    free = llm.pipeline.target.cache.allocator
    assert free.free_blocks == free.num_blocks


def test_per_request_configs(llm, alone):
    _, expected = alone
    short = llm.request_config(max_new_tokens=3)
    texts = llm.generate(PROMPTS[:2], config=[short, llm.request_config(max_new_tokens=10)])
    assert texts[1] == expected[1].text
    assert texts[0] == llm.pipeline.decode(expected[0].generated[:3])
    assert llm.request_config(ignore_eos=True).eos_token_ids == ()
    assert llm.config.eos_token_ids == (EOS_ID,)


def test_penalties_are_generation_options(llm, alone):
    """The penalties reach the requests as keywords, and equal the pipeline's (with the draft) on the same fields."""
    pipeline, expected = alone
    penalties = dict(repetition_penalty=1.8, frequency_penalty=0.5, presence_penalty=0.3)
    (request,), _ = pipeline.generate([PROMPTS[0]], 10, use_draft=False, **penalties)
    text = llm.generate(PROMPTS[0], max_new_tokens=10, num_assistant_tokens=3, **penalties)
    assert text == request.text and request.generated != expected[0].generated
    with pytest.raises(ConfigError, match="presence_penalty"):
        llm.generate("x", presence_penalty=float("nan"))


def test_bad_calls_are_clean_errors(llm, tiny_pair):
    with pytest.raises(ConfigError, match="unknown generation option"):
        llm.generate("x", max_tokens=3)
    with pytest.raises(RequestError, match="outside the vocabulary"):
        llm.generate([1, 10**6])
    with pytest.raises(RequestError, match="maximum context length is 4096"):
        llm.generate("x", max_new_tokens=5000)
    with pytest.raises(ConfigError, match="unknown runtime option"):
        LLM(tiny_pair[0], devise="CPU")


def test_the_api_refuses_what_the_runtime_would(tiny_pair):
    # --max-model-len below the target's context: the API's check is the scheduler's, not config.json's
    short = LLM(tiny_pair[0], max_model_len=12)
    with pytest.raises(RequestError, match="maximum context length is 12"):
        short.generate([1] * 8, max_new_tokens=5)
    assert isinstance(short.generate([1] * 8, max_new_tokens=4), str)  # 8 + 4 fits exactly


def cli(tiny_pair, *args) -> int:
    return main(["generate", "--target", str(tiny_pair[0]), "--max-new-tokens", "10", *args])


@pytest.mark.slow  # the CLI end to end
def test_cli_prompt_ids_equal_the_text_prompt(tiny_pair, alone, capsys):
    pipeline, expected = alone
    ids = ",".join(map(str, pipeline.encode(PROMPTS[2])))
    assert cli(tiny_pair, "--prompt-ids", ids) == 0
    assert capsys.readouterr().out == expected[2].text + "\n"
    assert cli(tiny_pair, "--prompt-ids", "1,x") == 2
    assert "--prompt-ids '1,x'" in capsys.readouterr().err


@pytest.mark.slow  # the CLI end to end
def test_cli_streams_every_request_prefixed_by_its_index(tiny_pair, alone, capsys):
    _, expected = alone
    assert cli(tiny_pair, *(a for p in PROMPTS for a in ("--prompt", p)), "--draft", str(tiny_pair[1])) == 0
    out = capsys.readouterr().out
    texts = {i: "" for i in range(len(PROMPTS))}
    for line in out.split("\n")[:-1]:
        index, rest = re.match(r"\[(\d+)\] (.*)", line, re.S).groups()
        if rest.startswith("--- "):
            assert rest == "--- length, 10 tokens"
        else:
            texts[int(index)] += rest
    # the printer breaks lines where the text has newlines: compare without them
    assert [texts[i] for i in range(len(PROMPTS))] == [r.text.replace("\n", "") for r in expected]


@pytest.mark.slow  # the CLI end to end
def test_cli_chat_renders_the_template(tiny_pair, capsys):
    pipeline = Pipeline(tiny_pair[0])
    # the tiny target's ChatML template, written out by hand
    (request,), _ = pipeline.generate("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", 10, use_draft=False)
    assert cli(tiny_pair, "--chat", "--prompt", "hi") == 0
    assert capsys.readouterr().out == request.text + "\n"


@pytest.mark.slow  # the CLI end to end
def test_cli_ignore_eos_runs_past_the_end_token(tiny_pair, alone, tmp_path):
    _, expected = alone
    # a copy of the target whose EOS is the first token it generates for PROMPTS[0]: it stops at once unless
    # --ignore-eos, and then generates exactly what the target alone does
    target = shutil.copytree(tiny_pair[0], tmp_path / "target")
    (target / "generation_config.json").write_text(json.dumps({"eos_token_id": expected[0].generated[0]}))
    runs = {}
    for flag in ((), ("--ignore-eos",)):
        out = tmp_path / f"run{len(flag)}.json"
        assert (
            main(
                [
                    "generate",
                    "--target",
                    str(target),
                    "--prompt",
                    PROMPTS[0],
                    "--max-new-tokens",
                    "10",
                    "--json",
                    str(out),
                    *flag,
                ]
            )
            == 0
        )
        runs[flag] = json.loads(out.read_text())["requests"][0]
    assert (runs[()]["generated_ids"], runs[()]["finish_reason"]) == ([], "stop")
    assert runs[("--ignore-eos",)]["generated_ids"] == expected[0].generated

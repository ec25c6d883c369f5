"""lm-evaluation-harness against `ovbuild serve`, on tasks this test writes (a YAML task and a jsonl of documents in
tmp_path), with its remote tokenizer (the server's /tokenize, /detokenize, /tokenizer_info):
- `local-completions` loglikelihood on the tiny pair (f32 target cache) equals the numpy reference's log-likelihood
  of each continuation;
- `local-completions` generate_until, until ["\\n"] and ["\\n\\n"], on the trained demo pair, equals the target alone
  in-process (Pipeline) with the same stop strings: exact match 1.0, empty answers included;
- `local-chat-completions` on the demo pair (its chat template) equals the Pipeline on the rendered prompt."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ovbuild.reference.qwen3 import Qwen3Reference
from ovbuild.runtime.pipeline import EXACT_TARGET, ModelOptions, RuntimeOptions
from ovbuild.serve.chat import ChatTemplate
from ovbuild.serve.server import BackgroundServer, build_app

pytestmark = pytest.mark.slow  # end to end: `pytest -m "not slow"` leaves it out

# lm-evaluation-harness is the lmeval extra (not in `test`: see pyproject.toml): pip install "ovbuild[lmeval]"
pytest.importorskip("lm_eval", reason="needs the lmeval extra: pip install 'ovbuild[lmeval]'")

F32_TARGET = RuntimeOptions(target=ModelOptions("f32", None, EXACT_TARGET.cache_mb))
PAIRS = [
    ("def add(a, b):", "\n    return a + b"),
    ("import os\n", "import sys\n"),
    ("class Stack:", "\n    def __init__(self):"),
    ("for i in range(10):", " print(i)"),
]
PROMPTS = ["def fib(n):", "import os", "class Stack:\n    def __init__(self):\n", "def add(a, b):\n    return", "#"]
MAX_GEN = 24


@pytest.fixture(scope="module")
def tiny_server(tiny_pair):
    with BackgroundServer(build_app(*tiny_pair, F32_TARGET, name="tiny")) as s:
        yield s


@pytest.fixture(scope="module")
def demo_server(demo_pair):
    with BackgroundServer(build_app(*demo_pair, name="demo")) as s:
        yield s


def write_task(folder, name: str, docs: list[dict], spec: str) -> None:
    """A task of `docs` (a local jsonl) in `folder`, its YAML `spec` after the dataset lines."""
    data = folder / f"{name}.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in docs))
    head = f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\ntest_split: test\n"
    (folder / f"{name}.yaml").write_text(head + spec)


def evaluate(folder, model: str, url: str, name: str, tasks: list[str], chat: bool = False) -> dict:
    """lm-eval's simple_evaluate on the tasks of `folder`, samples logged, one request at a time."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    endpoint = "chat/completions" if chat else "completions"
    args = {"model": name, "base_url": f"{url}/v1/{endpoint}", "num_concurrent": 1, "max_retries": 1}
    args |= {"tokenizer_backend": None} if chat else {"tokenizer_backend": "remote", "tokenized_requests": True}
    return simple_evaluate(
        model=model,
        model_args=args,
        tasks=tasks,
        task_manager=TaskManager(include_path=str(folder)),
        log_samples=True,
        apply_chat_template=chat,
    )


def test_loglikelihood_equals_the_numpy_reference(tmp_path, tiny_server, tiny_pair, target, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    from tokenizers import Tokenizer

    docs = [{"context": c, "continuation": t} for c, t in PAIRS]
    spec = 'output_type: loglikelihood\ndoc_to_text: "{{context}}"\ndoc_to_target: "{{continuation}}"\n'
    spec += 'target_delimiter: ""\n'
    write_task(tmp_path, "ovbuild_ll", docs, spec + "metric_list:\n  - metric: acc\n")
    results = evaluate(tmp_path, "local-completions", tiny_server.url, "tiny", ["ovbuild_ll"])
    samples = sorted(results["samples"]["ovbuild_ll"], key=lambda s: s["doc_id"])
    tokenizer = Tokenizer.from_file(str(tiny_pair[0] / "tokenizer.json"))
    reference = Qwen3Reference(*target)
    worst = 0.0
    for sample, (context, continuation) in zip(samples, PAIRS, strict=True):
        # lm-eval's split: trailing blanks of the context go to the continuation, whose tokens are the whole
        # text's after those of the context alone
        blanks = len(context) - len(context.rstrip())
        context, continuation = context[: len(context) - blanks], context[len(context) - blanks :] + continuation
        whole = tokenizer.encode(context + continuation, add_special_tokens=False).ids
        n = len(tokenizer.encode(context, add_special_tokens=False).ids)
        logits, _ = reference.forward(reference.new_cache(), np.array(whole))
        x = logits.astype(np.float64) - logits.max(-1, keepdims=True)
        rows = x - np.log(np.exp(x).sum(-1, keepdims=True))
        expected = sum(rows[i - 1, whole[i]] for i in range(n, len(whole)))
        measured = float(sample["filtered_resps"][0][0])
        worst = max(worst, abs(measured - expected))
    assert worst < 1e-4, f"lm-eval's loglikelihood differs from the numpy reference's by up to {worst:.2e}"


@pytest.mark.parametrize("until", [["\n"], ["\n\n"]], ids=["newline", "blank-line"])
def test_generate_until_equals_the_target_alone(tmp_path, demo_server, demo_pipeline, until, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    requests, _ = demo_pipeline.generate(PROMPTS, MAX_GEN, stop_strings=tuple(until), use_draft=False)
    expected = [r.text for r in requests]
    assert "" in expected or until != ["\n"], "no prompt's answer starts with the stop string"
    docs = [{"prompt": p, "target": t} for p, t in zip(PROMPTS, expected, strict=True)]
    kwargs = json.dumps({"until": until, "max_gen_toks": MAX_GEN, "do_sample": False})
    spec = 'output_type: generate_until\ndoc_to_text: "{{prompt}}"\ndoc_to_target: "{{target}}"\n'
    spec += f"generation_kwargs: {kwargs}\nmetric_list:\n  - metric: exact_match\n"
    write_task(tmp_path, "ovbuild_gen", docs, spec)
    results = evaluate(tmp_path, "local-completions", demo_server.url, "demo", ["ovbuild_gen"])
    samples = sorted(results["samples"]["ovbuild_gen"], key=lambda s: s["doc_id"])
    answers = [s["resps"][0][0] for s in samples]
    assert answers == expected
    assert results["results"]["ovbuild_gen"]["exact_match,none"] == 1.0


def test_local_chat_completions_on_the_demo_pair(tmp_path, demo_server, demo_pair, demo_pipeline, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    template = ChatTemplate.from_folder(demo_pair[0])
    questions = ["def add(a, b):", "Write a function that reverses a list."]
    rendered = [template.render([{"role": "user", "content": q}], True) for q in questions]
    requests, _ = demo_pipeline.generate(rendered, MAX_GEN, stop_strings=("\n",), use_draft=False)
    expected = [r.text for r in requests]
    docs = [{"question": q, "target": t} for q, t in zip(questions, expected, strict=True)]
    kwargs = json.dumps({"until": ["\n"], "max_gen_toks": MAX_GEN, "do_sample": False})
    spec = 'output_type: generate_until\ndoc_to_text: "{{question}}"\ndoc_to_target: "{{target}}"\n'
    spec += f"generation_kwargs: {kwargs}\nmetric_list:\n  - metric: exact_match\n"
    write_task(tmp_path, "ovbuild_chat", docs, spec)
    results = evaluate(tmp_path, "local-chat-completions", demo_server.url, "demo", ["ovbuild_chat"], chat=True)
    samples = sorted(results["samples"]["ovbuild_chat"], key=lambda s: s["doc_id"])
    assert [s["resps"][0][0] for s in samples] == expected
    assert results["results"]["ovbuild_chat"]["exact_match,none"] == 1.0

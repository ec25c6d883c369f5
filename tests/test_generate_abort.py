"""An aborted Pipeline.generate leaks nothing: after an exception or Ctrl-C from a callback or from inside a model
call, every cache block is free, the drafter holds no sequence, and the next call generates the same tokens."""

from __future__ import annotations

import pytest

from ovbuild.runtime.pipeline import ModelOptions, Pipeline, RuntimeOptions

PROMPTS = ["def add(a, b):", "import os\n", "hello", "x = [1, 2"]
F32 = ModelOptions("f32", "f32", 4)


class Boom(Exception):
    pass


@pytest.fixture(scope="module")
def pipeline(tiny_pair):
    return Pipeline(*tiny_pair, RuntimeOptions(target=F32, draft=F32))


@pytest.fixture(scope="module")
def expected(pipeline):
    requests, _ = pipeline.generate(PROMPTS, 12)
    assert_nothing_held(pipeline)
    return [r.generated for r in requests]


def assert_nothing_held(pipeline: Pipeline) -> None:
    for name, model in (("target", pipeline.target), ("draft", pipeline.drafter.model)):
        allocator = model.cache.allocator
        assert allocator.free_blocks == allocator.num_blocks, (
            f"{name} cache: {allocator.num_blocks - allocator.free_blocks} blocks still held"
        )
        assert allocator.tables == {}, f"{name} cache still has block tables for {sorted(allocator.tables)}"
    assert pipeline.drafter.committed == {}, f"drafter still tracks {sorted(pipeline.drafter.committed)}"


def fail_on_call(n: int, error: BaseException):
    """A callable that raises `error` on its n-th call, counting from 1."""
    calls = []

    def call(*args, **kwargs):
        calls.append(1)
        if len(calls) == n:
            raise error

    return call


@pytest.mark.parametrize("error", [Boom("from on_step"), KeyboardInterrupt()], ids=["exception", "ctrl_c"])
def test_error_from_the_step_callback_leaks_nothing(pipeline, expected, error):
    with pytest.raises(type(error)):
        pipeline.generate(PROMPTS, 12, on_step=fail_on_call(3, error))
    assert_nothing_held(pipeline)
    assert [r.generated for r in pipeline.generate(PROMPTS, 12)[0]] == expected


@pytest.mark.parametrize("model", ["target", "draft"])
def test_error_inside_a_model_call_leaks_nothing(pipeline, expected, model, monkeypatch):
    paged = pipeline.target if model == "target" else pipeline.drafter.model
    real_run, failing = paged.run, fail_on_call(3, Boom(f"inside the {model} call"))

    def run(rows, inputs, *more):
        out = real_run(rows, inputs, *more)  # the call has reserved its blocks and written the cache when it fails
        failing()
        return out

    monkeypatch.setattr(paged, "run", run)
    with pytest.raises(Boom):  # draft length pinned: the adaptive choice soon stops calling the tiny random draft
        pipeline.generate(PROMPTS, 12, num_assistant_tokens=3)
    monkeypatch.undo()
    assert_nothing_held(pipeline)
    assert [r.generated for r in pipeline.generate(PROMPTS, 12)[0]] == expected

"""`ovbuild generate` on exported tiny folders: text, JSON results with metrics and traces, clean errors."""

from __future__ import annotations

import json
import re

import openvino as ov
import pytest

from ovbuild import demo
from ovbuild.cli import main
from ovbuild.runtime.model.static_rows import COPY_ROWS

pytestmark = pytest.mark.slow  # end to end: `pytest -m "not slow"` leaves it out


def generate(tiny_pair, tmp_path, *extra):
    target, _ = tiny_pair
    out = tmp_path / f"out{len(list(tmp_path.iterdir()))}.json"
    args = [
        "generate",
        "--target",
        str(target),
        "--prompt",
        "def add(a, b):",
        "--prompt",
        "import os\n",
        "--max-new-tokens",
        "12",
        "--kv-cache-precision",
        "f32",
        "--json",
        str(out),
        *extra,
    ]
    assert main(args) == 0
    return json.loads(out.read_text())


def test_generate_with_and_without_draft_gives_the_same_tokens(tiny_pair, tmp_path, capsys):
    alone = generate(tiny_pair, tmp_path)
    spec = generate(tiny_pair, tmp_path, "--draft", str(tiny_pair[1]), "--trace", "--num-assistant-tokens", "5")
    assert [r["generated_ids"] for r in spec["requests"]] == [r["generated_ids"] for r in alone["requests"]]
    assert all(len(r["generated_ids"]) == 12 for r in spec["requests"])
    totals = spec["totals"]
    assert totals["num_generated_tokens"] == 24 and totals["num_draft_tokens"] > 0
    first = spec["requests"][0]
    assert first["prompt"] == "def add(a, b):" and first["trace"]
    assert all(len(step["proposed"]) <= 5 for step in first["trace"])
    err = capsys.readouterr().err
    assert "mean acceptance length" in err and "tokens/s" in err


def test_the_runtime_line_says_how_the_plugin_compiled_the_models(tiny_pair, tmp_path, capsys):
    """What the device runs, not what was asked: a bf16 hint on a CPU without bf16 units computes in f32."""
    bf16_units = "BF16" in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")
    options = ("--inference-precision", "bf16", "--kv-cache-precision", "u8", "--draft-inference-precision", "f32")
    results = generate(tiny_pair, tmp_path, "--draft", str(tiny_pair[1]), *options)
    target = "CPU, bf16 math" if bf16_units else "CPU, f32 math (bf16 asked)"
    expected = f"target {target}, u8 KV cache; draft CPU, f32 math, u8 KV cache"
    assert results["runtime"] == expected
    assert f"runtime              {expected}" in capsys.readouterr().err


def test_single_prompt_streams_its_text(tiny_pair, tmp_path, capsys):
    target, _ = tiny_pair
    assert main(["generate", "--target", str(target), "--prompt", "x = ", "--max-new-tokens", "6"]) == 0
    out = capsys.readouterr().out
    assert out.endswith("\n") and len(out) > 1


def test_missing_prompt_and_missing_folder_are_clean_errors(tiny_pair, tmp_path, capsys):
    target, _ = tiny_pair
    assert main(["generate", "--target", str(target)]) == 2
    assert "no prompt given" in capsys.readouterr().err
    assert main(["generate", "--target", str(tmp_path / "nope"), "--prompt", "a"]) == 2
    assert "no such IR file" in capsys.readouterr().err


def test_sampling_options_same_seed_same_output_and_clean_errors(tiny_pair, tmp_path, capsys):
    sample = ("--draft", str(tiny_pair[1]), "--do-sample", "--temperature", "0.7", "--top-k", "20", "--top-p", "0.9")
    runs = [generate(tiny_pair, tmp_path, *sample, "--seed", seed) for seed in ("5", "5", "6")]
    ids = [[r["generated_ids"] for r in run["requests"]] for run in runs]
    assert ids[0] == ids[1] and ids[0] != ids[2]
    target, _ = tiny_pair
    capsys.readouterr()
    for bad, message in (("--temperature=0", "temperature = 0.0"), ("--top-p=1.5", "top_p = 1.5")):
        assert main(["generate", "--target", str(target), "--prompt", "a", "--do-sample", bad]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"ovbuild: error: {message}") and err.count("\n") == 1


def test_demo_on_the_tiny_pair_is_lossless_and_shows_its_progress(capsys, monkeypatch):
    # Which copies exist when timing starts: one compiled in a timed round costs that side 0.1-0.4 s. Whether the
    # timed rounds would need a new one depends on when the planner drafts, so every row count must be there.
    compiled_when_timed, real_compare = [], demo.compare

    def compare(pipeline, *args, **kwargs):
        models = {"target": pipeline.target, "draft": pipeline.drafter.model}
        compiled_when_timed.append({name: set(model.static.copies) for name, model in models.items()})
        return real_compare(pipeline, *args, **kwargs)

    monkeypatch.setattr(demo, "compare", compare)
    assert main(["demo", "--tiny", "--max-new-tokens", "8", "--rounds", "2"]) == 0  # the adaptive draft length
    every = {"target": set(COPY_ROWS), "draft": set(COPY_ROWS)}
    assert compiled_when_timed == [every, every], f"copies missing when timing started: {compiled_when_timed}"
    captured = capsys.readouterr()
    out, err = captured.out, captured.err
    assert "outputs identical with and without the draft: yes" in out
    assert re.search(r"\nruntime: target CPU, \w+ math.*, \w+ KV cache; draft CPU, \w+ math, \w+ KV cache\n", out)
    assert "mean acceptance length" in out and "draft length chosen" in out
    for way in ("one request at a time", "4 concurrent requests"):
        assert re.search(rf"\ndraft lengths chosen, {way}: (k=\d+ \d+%(, )?)+ of \d+ decode steps\n", out)
        # the random pair accepts nothing: a speed-up with its range where the planner drafted, else said in words
        ran = re.search(rf"\nspeed-up, {way}: [\d.]+x, median of 2 rounds \(range [\d.]+-[\d.]+x.*drafting in", out)
        skipped = re.search(rf"\nspeculation did not run, {way}: the planner drafted in \d+ of \d+ decode steps", out)
        assert bool(ran) != bool(skipped), out
    for i in range(1, 5):  # stdout is not a terminal here: labelled blocks, no escape codes
        assert f"--- prompt {i}\n" in out and f"--- completion {i} (8 tokens, length)\n" in out
    assert "\x1b" not in out
    stages = [line.split("] ", 1)[1] for line in err.splitlines() if re.match(r"\[ *[\d.]+ s\] ", line)]
    assert stages[:5] == [
        "writing the tiny random pair...",
        "exporting the target...",
        "exporting the draft...",
        "compiling...",
        "warming up...",
    ]
    assert stages[-1] == "done", err


def test_demo_refuses_zero_rounds_before_exporting(capsys):
    assert main(["demo", "--tiny", "--rounds", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ovbuild: error: rounds = 0") and err.count("\n") == 1


def test_penalty_options_reach_the_requests_with_and_without_the_draft(tiny_pair, tmp_path, capsys):
    penalties = ("--repetition-penalty", "1.8", "--frequency-penalty", "0.5", "--min-new-tokens", "4")
    plain = generate(tiny_pair, tmp_path)
    runs = [generate(tiny_pair, tmp_path, *penalties, *draft) for draft in ((), ("--draft", str(tiny_pair[1])))]
    ids = [[r["generated_ids"] for r in run["requests"]] for run in (plain, *runs)]
    assert ids[1] == ids[2] and ids[1] != ids[0]
    target, _ = tiny_pair
    capsys.readouterr()
    for bad, message in (
        ("--presence-penalty=nan", "presence_penalty must be a finite number"),
        ("--min-new-tokens=20", "min_new_tokens = 20 is more than max_new_tokens = 16"),
    ):
        assert main(["generate", "--target", str(target), "--prompt", "a", "--max-new-tokens", "16", bad]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"ovbuild: error: {message}") and err.count("\n") == 1

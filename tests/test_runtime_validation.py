"""Run-time input is refused before any work: one `ovbuild: error:` line and exit 2 from the CLI, a typed error
from Python (Pipeline, Scheduler.add_request, GenerationConfig)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from ovbuild.errors import ConfigError, RequestError, UnsupportedError
from ovbuild.graph.target import build_target
from ovbuild.ir import save_ir
from ovbuild.runtime.model import machine
from ovbuild.runtime.model.devices import cpu_kv_precisions, draft_inference_precision, target_inference_precision
from ovbuild.runtime.model.paged_model import PagedModel
from ovbuild.runtime.pipeline import ModelOptions, Pipeline, RuntimeOptions
from ovbuild.runtime.request import GenerationConfig
from ovbuild.runtime.scheduler import Scheduler
from ovbuild.runtime.validation import check_writable
from ovbuild.targets import load_target
from ovbuild.testing import write_tiny_target
from ovbuild.weights.checkpoint import Checkpoint

from export_helpers import assert_clean_error, ovbuild

EXPORT_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "config.json")


@pytest.fixture(scope="module")
def pipeline(tiny_pair):
    return Pipeline(*tiny_pair)


@pytest.fixture
def no_work(monkeypatch):
    """Fail the test if a model is compiled or a scheduler steps: the checks must come first."""

    def refuse(*args, **kwargs):
        raise AssertionError("work started before the input was checked")

    monkeypatch.setattr(PagedModel, "__init__", refuse)
    monkeypatch.setattr(Scheduler, "step", refuse)


@pytest.fixture
def no_step(monkeypatch):
    """Models may be compiled (the tokenizer lives with them) but nothing is generated."""

    def refuse(*args, **kwargs):
        raise AssertionError("generation started before the input was checked")

    monkeypatch.setattr(Scheduler, "step", refuse)


def generate(capsys, tiny_pair, *extra, prompt="hello"):
    target, _ = tiny_pair
    return ovbuild(capsys, "generate", "--target", target, "--prompt", prompt, "--max-new-tokens", 4, *extra)


def assert_one_line(run, message: str) -> None:
    assert_clean_error(run, message)
    assert "Traceback" not in run.err and not run.out


# -- command line: options checked before any model is compiled ---------------------------------------------------

OPTION_CASES = {
    "max_new_tokens_zero": (["--max-new-tokens", "0"], "--max-new-tokens must be an integer >= 1, got 0"),
    "max_new_tokens_negative": (["--max-new-tokens", "-3"], "--max-new-tokens must be an integer >= 1, got -3"),
    "max_model_len_zero": (["--max-model-len", "0"], "--max-model-len must be an integer >= 1, got 0"),
    "max_num_seqs_zero": (["--max-num-seqs", "0"], "--max-num-seqs must be an integer >= 1, got 0"),
    "empty_stop": (["--stop", ""], '--stop "" is empty: an empty stop string would end every request at once'),
    "non_utf8_prompt": (["--prompt", "ok\udcff"], "--prompt 2 is not valid UTF-8 (byte 0xff at character 2)"),
    "cache_nan": (["--cache-mb", "nan"], "--cache-mb must be a finite number of megabytes > 0, got nan"),
    "cache_inf": (["--cache-mb", "inf"], "--cache-mb must be a finite number of megabytes > 0, got inf"),
    "cache_zero": (["--cache-mb", "0"], "--cache-mb must be a finite number of megabytes > 0, got 0.0"),
    "cache_negative": (["--cache-mb", "-5"], "--cache-mb must be a finite number of megabytes > 0, got -5.0"),
    "cache_beyond_memory": (["--cache-mb", "1e12"], "MB is more than this machine's physical memory"),
    "draft_cache_nan": (["--draft", "DRAFT", "--draft-cache-mb", "nan"], "--draft-cache-mb must be a finite number"),
    "draft_cache_beyond_memory": (["--draft", "DRAFT", "--draft-cache-mb", "1e12"], "physical memory"),
    "unknown_device": (["--device", "NPU7"], "unknown device 'NPU7' (available: CPU"),
    # bf16 math needs a bf16 cache and f32 math an f32 one on every CPU (AVX2-only or with bf16 units)
    "kv_precision": (
        ["--kv-cache-precision", "bf16", "--inference-precision", "f32"],
        "--kv-cache-precision 'bf16' does not run on CPU at inference precision f32 (choices: u8, f16, f32)",
    ),
}


@pytest.mark.parametrize("case", OPTION_CASES, ids=list(OPTION_CASES))
def test_bad_option_is_one_line_before_any_model_is_compiled(case, tiny_pair, capsys, no_work):
    extra, message = OPTION_CASES[case]
    extra = [str(tiny_pair[1]) if a == "DRAFT" else a for a in extra]
    assert_one_line(generate(capsys, tiny_pair, *extra), message)


def test_non_utf8_prompt_files_are_refused(tiny_pair, tmp_path, capsys, no_work):
    text = tmp_path / "prompt.txt"
    text.write_bytes(b"def f():\xff\n")
    assert_one_line(
        generate(capsys, tiny_pair, "--prompt-file", text),
        f"{text}: prompt file is not valid UTF-8 (byte 0xff at offset 8)",
    )
    listed = tmp_path / "prompts.json"
    listed.write_text('["fine", "lone \\udcff surrogate"]')  # valid JSON whose second string is not UTF-8
    assert_one_line(
        generate(capsys, tiny_pair, "--prompt-file", listed), f"{listed}: prompt 2 is not valid UTF-8 (byte 0xff"
    )


def test_unwritable_json_path_is_refused_before_generating(tiny_pair, tmp_path, capsys, no_work):
    missing = tmp_path / "no_such_folder" / "out.json"
    assert_one_line(
        generate(capsys, tiny_pair, "--json", missing),
        f"--json {missing}: cannot be written (no folder {missing.parent})",
    )
    assert_one_line(generate(capsys, tiny_pair, "--json", tmp_path), f"--json {tmp_path}: is a folder, not a file")
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    assert_one_line(generate(capsys, tiny_pair, "--json", blocker / "out.json"), "cannot be written (no folder")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]  # the probe leaves nothing behind


def test_json_probe_reports_a_read_only_folder(tmp_path, monkeypatch):
    """Root writes through permission bits, so a read-only folder is simulated where the probe creates its file."""

    def read_only(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr("tempfile.NamedTemporaryFile", read_only)
    with pytest.raises(ConfigError, match=r"--json .*out.json: cannot be written \(Permission denied\)"):
        check_writable(tmp_path / "out.json", "--json")


# -- command line: checks that need the target's tokenizer and context length --------------------------------------


def test_prompt_beyond_the_context_length_is_refused(tiny_pair, capsys, no_step):
    # "hello" is 5 byte tokens; the tiny target's config.json says max_position_embeddings 4096
    assert_one_line(
        generate(capsys, tiny_pair, "--max-new-tokens", "4092"),
        "prompt 1: 5 prompt tokens + max_new_tokens 4092 = 4097 positions, beyond max_model_len 4096",
    )
    assert_one_line(
        generate(capsys, tiny_pair, "--max-model-len", "8"),
        "prompt 1: 5 prompt tokens + max_new_tokens 4 = 9 positions, beyond max_model_len 8",
    )
    assert_one_line(
        generate(capsys, tiny_pair, "--max-model-len", "5000"),
        "max model length 5000 is beyond the 4096 positions target",
    )


def test_max_model_len_allows_what_fits(tiny_pair, capsys):
    assert generate(capsys, tiny_pair, "--max-model-len", "9").code == 0


def test_prompt_tokens_outside_the_vocabulary_are_refused(tiny_pair, tmp_path, capsys, no_step):
    # A target of 128 tokens with the 258-token byte tokenizer: "é" encodes as bytes 0xc3 0xa9.
    ckpt = write_tiny_target(tmp_path / "ckpt", vocab_size=128)
    cfg, weights = load_target(Checkpoint.open(ckpt))
    save_ir(build_target(cfg, weights), tmp_path / "small" / "openvino_model.xml")
    for name in EXPORT_FILES:
        shutil.copy(ckpt / name, tmp_path / "small" / name)
    run = ovbuild(capsys, "generate", "--target", tmp_path / "small", "--prompt", "abé")
    assert_one_line(run, "prompt 1: token id 195 at position 2 is outside the vocabulary (0..127)")


# -- Python ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [0, -1, 2.5, True, "8", None])
def test_generation_config_needs_a_positive_integer(value):
    with pytest.raises(ConfigError, match=rf"max_new_tokens must be an integer >= 1, got {value!r}"):
        GenerationConfig(max_new_tokens=value)


def test_generation_config_refuses_empty_stop_strings():
    with pytest.raises(ConfigError, match='stop_strings "" is empty'):
        GenerationConfig(stop_strings=("ok", ""))
    assert GenerationConfig(max_new_tokens=np.int64(3), stop_strings=("\n",)).max_new_tokens == 3


def test_scheduler_refuses_ids_outside_the_vocabulary_and_too_long_requests(pipeline):
    scheduler = pipeline.scheduler()
    outside = r"request 0: token id 320 at position 1 is outside the vocabulary \(0..319\)"
    with pytest.raises(RequestError, match=outside):
        scheduler.add_request([5, 320, 7])
    with pytest.raises(RequestError, match=r"request 0: token id -1 at position 0 is outside the vocabulary"):
        scheduler.add_request([-1])
    with pytest.raises(RequestError, match="request 0: the prompt must be a flat list of integer token ids"):
        scheduler.add_request([1.5, 2.0])
    with pytest.raises(RequestError, match="3 prompt tokens \\+ max_new_tokens 4094 = 4097 positions, beyond"):
        scheduler.add_request([1, 2, 3], GenerationConfig(max_new_tokens=4094))
    assert not scheduler.has_unfinished()
    scheduler.add_request([1, 2, 3], GenerationConfig(max_new_tokens=4093))  # exactly fits


def test_pipeline_checks_every_prompt_before_queueing_any(pipeline, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a request was queued")

    monkeypatch.setattr(Scheduler, "add_request", refuse)
    with pytest.raises(RequestError, match=r"prompt 2 is not valid UTF-8 \(byte 0xfe at character 1\)"):
        pipeline.generate(["fine", "a\udcfe"], 4)
    with pytest.raises(RequestError, match="prompt 2: 3 prompt tokens \\+ max_new_tokens 4094"):
        pipeline.generate(["a", "abc"], 4094)
    with pytest.raises(RequestError, match="a prompt must be a string or a non-empty list of token ids"):
        pipeline.generate([b"bytes"], 4)
    with pytest.raises(ConfigError, match="max_new_tokens must be an integer >= 1, got 0"):
        pipeline.generate(["a"], 0)


def test_pipeline_refuses_bad_runtime_options_before_compiling(tiny_pair, no_work):
    cases = [
        (RuntimeOptions(device="FPGA"), ConfigError, "unknown device 'FPGA' \\(available: CPU"),
        (RuntimeOptions(target=ModelOptions("f16", "f32", float("nan"))), ConfigError, "target cache_mb must be"),
        (RuntimeOptions(draft=ModelOptions("u8", None, -1)), ConfigError, "draft cache_mb must be"),
        (RuntimeOptions(target=ModelOptions("bf16", "f32", 16)), UnsupportedError, "choices: u8, f16, f32"),
        (RuntimeOptions(target=ModelOptions("f8", None, 16)), UnsupportedError, "is not one of u8, f16, bf16, f32"),
        (RuntimeOptions(max_model_len=0), ConfigError, "max_model_len must be an integer >= 1, got 0"),
    ]
    for options, error, message in cases:
        with pytest.raises(error, match=message):
            Pipeline(*tiny_pair, options)


def test_pipeline_max_model_len_lowers_the_limit(tiny_pair):
    lowered = Pipeline(tiny_pair[0], options=RuntimeOptions(max_model_len=6))
    assert lowered.max_model_len == 6
    with pytest.raises(RequestError, match="beyond max_model_len 6"):
        lowered.generate(["abc"], 4)
    (request,), _ = lowered.generate(["abc"], 3)
    assert len(request.generated) == 3


def test_cpu_kv_precisions_follow_the_plugins_compute_precision():
    avx2 = ["FP32", "INT8", "BIN", "EXPORT_IMPORT"]  # an AVX2-only CPU computes in f32 whatever it is asked
    with_bf16 = ["BF16", *avx2]
    assert cpu_kv_precisions(avx2, None) == ("u8", "f16", "f32")
    assert cpu_kv_precisions(avx2, "bf16") == ("u8", "f16", "f32")
    assert cpu_kv_precisions(with_bf16, None) == ("u8", "f16", "bf16")
    assert cpu_kv_precisions(with_bf16, "f32") == ("u8", "f16", "f32")
    assert cpu_kv_precisions(["FP16", *with_bf16], "f16") == ("u8", "f16")


@pytest.mark.parametrize("flags", [{"avx2"}, {"avx2", "avx512f", "avx512_bf16"}, {"avx512_bf16", "amx_bf16"}])
def test_a_draft_runs_in_f32_on_a_cpu_without_amx_unless_told_otherwise(flags, monkeypatch):
    """The draft's default inference precision: f32 on a CPU without AMX (bf16 math cost a draft more there than it
    saved), the device's own with AMX; a requested precision, a bf16 cache (bf16 math only) and other devices keep
    theirs."""
    monkeypatch.setattr(machine, "cpu_flags", lambda: frozenset(flags))
    amx = "amx_bf16" in flags
    assert draft_inference_precision("CPU", None, "u8") == (None if amx else "f32")
    assert draft_inference_precision("CPU", None, "f16") == (None if amx else "f32")
    assert draft_inference_precision("CPU", "bf16", "u8") == "bf16"
    assert draft_inference_precision("CPU", None, "bf16") is None
    assert draft_inference_precision("GPU", None, "u8") is None


@pytest.mark.parametrize("flags", [{"avx2"}, {"avx2", "avx512f", "avx512_bf16"}, {"avx512_bf16", "amx_bf16"}])
def test_a_target_runs_in_bf16_only_where_that_was_measured_exact(flags, monkeypatch):
    """The target's default inference precision: bf16 on a CPU with AVX-512 bf16 units and no AMX, for a target
    without states; f32 elsewhere, with an f32 cache and on other devices; the device's own with a bf16 cache; a
    requested precision is kept."""
    monkeypatch.setattr(machine, "cpu_flags", lambda: frozenset(flags))
    bf16 = flags == {"avx2", "avx512f", "avx512_bf16"}
    assert target_inference_precision("CPU", None, "f16") == ("bf16" if bf16 else "f32")
    assert target_inference_precision("CPU", None, "u8") == ("bf16" if bf16 else "f32")
    assert target_inference_precision("CPU", None, "u8", stateful=True) == "f32"
    assert target_inference_precision("CPU", None, "f32") == "f32"
    assert target_inference_precision("CPU", None, "bf16") is None
    assert target_inference_precision("CPU", "f32", "u8") == "f32"
    assert target_inference_precision("GPU", None, "f16") == "f32"


@pytest.mark.parametrize("part", ["openvino_model.bin", "openvino_model.xml"])
def test_a_truncated_ir_is_one_error_line_naming_it(tiny_pair, tmp_path, capsys, part):
    """A copy or download cut short: an ovbuild error that names the IR, not OpenVINO's traceback."""
    target = shutil.copytree(tiny_pair[0], tmp_path / "target")
    with open(target / part, "r+b") as f:
        f.truncate(f.seek(0, 2) // 2)
    run = ovbuild(capsys, "generate", "--target", target, "--prompt", "abc", "--max-new-tokens", "2")
    assert_clean_error(run, f"{target / 'openvino_model.xml'}: cannot be read (")


@pytest.mark.parametrize(
    "name, extra, message",
    [
        ("tokenizer.json", (), "not a tokenizer the tokenizers library can read"),
        ("generation_config.json", (), "not valid JSON"),
        ("tokenizer_config.json", ("--chat",), "not valid JSON"),
    ],
)
def test_a_damaged_file_of_the_target_folder_is_one_error_line_naming_it(
    tiny_pair, tmp_path, capsys, name, extra, message
):
    target = shutil.copytree(tiny_pair[0], tmp_path / "target")
    if name == "tokenizer_config.json":  # a chat template to read
        (target / name).write_text(json.dumps({"chat_template": "{{ messages[0]['content'] }}"}))
    text = (target / name).read_text()
    (target / name).write_text(text[: len(text) // 2])
    run = ovbuild(capsys, "generate", "--target", target, "--prompt", "abc", "--max-new-tokens", "2", *extra)
    assert_clean_error(run, f"{target / name}: {message}")


def test_eos_token_ids_must_be_token_ids(tiny_pair, tmp_path, capsys):
    target = shutil.copytree(tiny_pair[0], tmp_path / "target")
    (target / "generation_config.json").write_text(json.dumps({"eos_token_id": "</s>"}))
    run = ovbuild(capsys, "generate", "--target", target, "--prompt", "abc", "--max-new-tokens", "2")
    assert_clean_error(run, "generation_config.json: eos_token_id '</s>' is not a token id or a list of them")


@pytest.mark.slow  # the CLI end to end
def test_results_written_to_json_after_the_checks(tiny_pair, tmp_path, capsys):
    out = tmp_path / "out.json"
    assert generate(capsys, tiny_pair, "--json", out).code == 0
    assert len(json.loads(out.read_text())["requests"]) == 1


@pytest.mark.slow  # the CLI end to end
def test_static_rows_option_reaches_both_models(tiny_pair, capsys, monkeypatch):
    seen = []
    init = PagedModel.__init__

    def spy(self, *args, static_rows=None, **kwargs):
        seen.append(static_rows)
        init(self, *args, static_rows=static_rows, **kwargs)

    monkeypatch.setattr(PagedModel, "__init__", spy)
    for choice, expected in (("off", False), ("auto", None), ("on", True)):
        seen.clear()
        run = generate(capsys, tiny_pair, "--draft", str(tiny_pair[1]), "--static-rows", choice)
        assert run.code == 0 and "generated tokens" in run.err, run.err
        assert seen == [expected, expected], f"--static-rows {choice}: the target and the draft got {seen}"


def test_static_rows_on_is_refused_off_cpu(tiny_pair, capsys, monkeypatch, no_work):
    monkeypatch.setattr("ovbuild.runtime.model.devices.check_device", lambda device: None)  # as if the device existed
    assert_one_line(
        generate(capsys, tiny_pair, "--device", "GPU", "--static-rows", "on"),
        "--static-rows on: static copies run on CPU, not on GPU",
    )


def test_pipeline_refuses_static_rows_off_cpu_as_the_command_does(tiny_pair, monkeypatch, no_work):
    """One check for both (pipeline.check_options): Python's message names the option as Python spells it."""
    monkeypatch.setattr("ovbuild.runtime.model.devices.check_device", lambda device: None)  # as if the device existed
    options = RuntimeOptions(device="GPU", target=ModelOptions("f16", None, 16, static_rows=True))
    with pytest.raises(UnsupportedError, match="static_rows=True: static copies run on CPU, not on GPU"):
        Pipeline(*tiny_pair, options)

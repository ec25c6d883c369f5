"""Every bad input to `ovbuild export` gives one `ovbuild: error:` line naming what is wrong, exit code 2, and
leaves nothing behind: no OUT, no partial folder, no parent folder created for it."""

from __future__ import annotations

import json
import shutil

import huggingface_hub.constants
import numpy as np
import pytest

from ovbuild.errors import ConfigError
from ovbuild.export import export
from ovbuild.testing import write_tiny_dflash, write_tiny_target
from ovbuild.weights.safetensors_file import SafetensorsFile, write_safetensors
from ovbuild.weights.tensor import WeightTensor

from export_helpers import assert_clean_error, ovbuild, snapshot


def edit_config(folder, drop=(), **changes):
    path = folder / "config.json"
    config = json.loads(path.read_text())
    for key in drop:
        del config[key]
    path.write_text(json.dumps({**config, **changes}))
    return folder


def edit_tensors(folder, drop=(), **replace):
    """Rewrite model.safetensors without the `drop` tensors and with `replace` arrays (name with `.` as `__`)."""
    path = folder / "model.safetensors"
    stored = SafetensorsFile(path)
    tensors = {n: WeightTensor(n, stored.read(n).dtype, stored.read(n).array.copy()) for n in stored.tensors}
    for name in drop:
        del tensors[name]
    for key, array in replace.items():
        name = key.replace("__", ".")
        tensors[name] = WeightTensor(name, "f32", array)
    write_safetensors(path, tensors)
    return folder


def truncate(folder, nbytes=100):
    path = folder / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-nbytes])
    return folder


def draft(tmp, **overrides):
    return write_tiny_dflash(tmp / "draft", **overrides)


def target(tmp, **overrides):
    return write_tiny_target(tmp / "target", **overrides)


def layers(n):
    return dict(num_hidden_layers=n, layer_types=["full_attention"] * n)


def with_target(folder):
    return ["--target-model", folder]


# Each case: (id, setup(tmp, T, D) -> (MODEL, extra args), expected message). T / D are the good tiny checkpoints.
CASES = [
    ("missing config key", lambda tmp, T, D: (edit_config(draft(tmp), drop=["hidden_size"]), with_target(T)),
     "draft/config.json: key 'hidden_size' is missing"),
    ("conflicting nested and flat key", lambda tmp, T, D: (draft(tmp, block_size=4), with_target(T)),
     "key 'block_size' = 4 conflicts with 'dflash_config.block_size' = 8"),
    ("duplicate taps in the draft config",
     lambda tmp, T, D: (draft(tmp, dflash_config={"mask_token_id": 257, "target_layer_ids": [1, 1]}), with_target(T)),
     "key 'dflash_config.target_layer_ids' has duplicates: [1, 1]"),
    ("--target-layer-ids out of range", lambda tmp, T, D: (T, ["--target-layer-ids", "1,6"]),
     "--target-layer-ids = [1, 6]: 6 is out of range [0, 6)"),
    ("--target-layer-ids not integers", lambda tmp, T, D: (T, ["--target-layer-ids", "1,x"]),
     "--target-layer-ids must be comma-separated layer indices, got '1,x'"),
    ("missing tensor", lambda tmp, T, D: (edit_tensors(draft(tmp), drop=["layers.1.mlp.up_proj.weight"]),
                                          with_target(T)),
     "tensor 'layers.1.mlp.up_proj.weight' is missing from the checkpoint"),
    ("wrong shape", lambda tmp, T, D: (edit_tensors(draft(tmp), layers__0__self_attn__k_proj__weight=np.zeros((32, 64),
                                                                                        np.float32)), with_target(T)),
     "tensor 'layers.0.self_attn.k_proj.weight' has shape [32, 64], expected [64, 64]"),
    ("truncated safetensors", lambda tmp, T, D: (truncate(draft(tmp)), with_target(T)),
     "model.safetensors: truncated safetensors file"),
    ("shard missing", lambda tmp, T, D: (drop_shard(target(tmp, shards=2)), []),
     "shard 'model-00002-of-00002.safetensors' listed in the index is missing"),
    ("unknown architecture", lambda tmp, T, D: (edit_config(target(tmp), architectures=["LlamaForCausalLM"]), []),
     "unknown architecture 'LlamaForCausalLM' (targets: Qwen3ForCausalLM, Qwen3_5ForConditionalGeneration, "
     "Qwen3_5ForCausalLM, Qwen3_5MoeForConditionalGeneration, Qwen3_5MoeForCausalLM, "
     "MiniCPMV4_7ForConditionalGeneration; drafts: "),
    ("pickle checkpoint", lambda tmp, T, D: (pickled(tmp), []), "reads safetensors only and never unpickles"),
    ("draft taps beyond the target's layers",
     lambda tmp, T, D: (draft(tmp, num_target_layers=None), with_target(target(tmp, **layers(4)))),
     "taps target layers [1, 3, 5] but target"),
    ("draft trained on another layer count", lambda tmp, T, D: (D, with_target(target(tmp, **layers(8)))),
     "was trained on a target of 6 layers (num_target_layers) but target"),
    ("fc input size", lambda tmp, T, D: (draft(tmp, target_hidden_size=32), with_target(T)),
     "fc takes 96 inputs but target"),
    ("draft hidden size differs from the target's",
     lambda tmp, T, D: (edit_config(draft(tmp, target_hidden_size=32), target_hidden_size=32),
                        with_target(target(tmp, hidden_size=32))),
     "has hidden_size 64 but target"),
    ("vocab mismatch", lambda tmp, T, D: (D, with_target(target(tmp, vocab_size=400))),
     "has vocab_size 320 but target"),
    ("draft without a target", lambda tmp, T, D: (D, []),
     "the draft has no embed_tokens / lm_head of its own: pass --target-model"),
    ("draft given as the target", lambda tmp, T, D: (D, with_target(D)),
     "unknown target architecture 'DFlashDraftModel'"),
    ("target given --target-model", lambda tmp, T, D: (T, with_target(T)),
     "is a target: --target-model is only for draft exports"),
    ("draft given --draft-of", lambda tmp, T, D: (D, [*with_target(T), "--draft-of", D]),
     "is a draft: --target-layer-ids and --draft-of are only for target exports"),
    ("--draft-of a draft that does not fit", lambda tmp, T, D: (target(tmp, **layers(8)), ["--draft-of", D]),
     "was trained on a target of 6 layers"),
    # The files copied next to the IRs: checked before the build, so a runtime never meets a file it cannot read.
    ("tokenizer.json of the wrong shape", lambda tmp, T, D: (write(target(tmp), "tokenizer.json", '{"model": 3}'), []),
     "target/tokenizer.json: cannot be loaded as a tokenizer (data did not match any variant of untagged enum"),
    ("tokenizer.json cut short", lambda tmp, T, D: (cut(target(tmp), "tokenizer.json"), []),
     "target/tokenizer.json: cannot be loaded as a tokenizer (EOF while parsing"),
    ("tokenizer.json that GenAI needs, unloadable",
     lambda tmp, T, D: (write(target(tmp), "tokenizer.json", "[]"), ["--format", "genai"]),
     "target/tokenizer.json: cannot be loaded as a tokenizer ("),
    ("target without tokenizer.json", lambda tmp, T, D: (remove(target(tmp), "tokenizer.json"), []),
     "target: no tokenizer.json (a target is exported with its tokenizer, which runtimes read)"),
    ("tokenizer_config.json not an object", lambda tmp, T, D: (write(target(tmp), "tokenizer_config.json", "[1]"), []),
     "target/tokenizer_config.json: expected a JSON object"),
    ("tokenizer_config.json not JSON", lambda tmp, T, D: (write(target(tmp), "tokenizer_config.json", "{eos"), []),
     "target/tokenizer_config.json: not valid JSON (Expecting property name enclosed in double quotes"),
    ("tokenizer_config.json eos_token a list",
     lambda tmp, T, D: (write(target(tmp), "tokenizer_config.json", '{"eos_token": [1]}'), []),
     "target/tokenizer_config.json: key 'eos_token' must be a token string or {\"content\": string}, got [1]"),
    ("tokenizer_config.json chat_template a number",
     lambda tmp, T, D: (write(target(tmp), "tokenizer_config.json", '{"chat_template": 3}'), []),
     "target/tokenizer_config.json: key 'chat_template' must be a string or a list of {name, template} objects"),
    ("chat_template.jinja not UTF-8", lambda tmp, T, D: (write(target(tmp), "chat_template.jinja", b"\xff\xfe"), []),
     "target/chat_template.jinja: not a UTF-8 text file"),
    ("generation_config.json not JSON", lambda tmp, T, D: (write(target(tmp), "generation_config.json", "{,}"), []),
     "target/generation_config.json: not valid JSON (Expecting property name enclosed in double quotes"),
    ("generation_config.json not an object",
     lambda tmp, T, D: (write(target(tmp), "generation_config.json", '"greedy"'), []),
     "target/generation_config.json: expected a JSON object"),
    ("generation_config.json eos_token_id a string",
     lambda tmp, T, D: (write(target(tmp), "generation_config.json", '{"eos_token_id": "</s>"}'), []),
     "target/generation_config.json: key 'eos_token_id' must be a list of integers, got '</s>'"),
    ("a draft's generation_config.json not JSON",
     lambda tmp, T, D: (write(draft(tmp), "generation_config.json", "nope"), with_target(T)),
     "draft/generation_config.json: not valid JSON (Expecting value"),
]  # fmt: skip


def write(folder, name, content):
    path = folder / name
    path.write_bytes(content) if isinstance(content, bytes) else path.write_text(content)
    return folder


def cut(folder, name):
    text = (folder / name).read_text()
    return write(folder, name, text[: len(text) // 2])


def remove(folder, name):
    (folder / name).unlink()
    return folder


def drop_shard(folder):
    (folder / "model-00002-of-00002.safetensors").unlink()
    return folder


def pickled(tmp):
    folder = tmp / "pickled"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "pytorch_model.bin").write_bytes(b"\x80\x04not really a pickle")
    return folder


@pytest.mark.parametrize("setup, message", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_clear_line_and_leaves_nothing(tmp_path, capsys, tiny_target, tiny_draft, setup, message):
    model, extra = setup(tmp_path, tiny_target, tiny_draft)
    before = snapshot(tmp_path)
    run = ovbuild(capsys, "export", "-m", model, tmp_path / "exports" / "out", *extra)
    assert_clean_error(run, message)
    assert run.out == ""
    assert snapshot(tmp_path) == before, f"left behind: {snapshot(tmp_path) - before}"


def test_unreachable_hub_id_while_offline(tmp_path, tmp_path_factory, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    cache = tmp_path_factory.mktemp("hf_cache")
    before = snapshot(tmp_path)
    run = ovbuild(capsys, "export", "-m", "z-lab/Qwen3-4B-DFlash-b16", tmp_path / "out", "--cache-dir", cache)
    assert_clean_error(
        run, "z-lab/Qwen3-4B-DFlash-b16: not in the local cache and the Hugging Face Hub is unreachable (offline?)"
    )
    assert snapshot(tmp_path) == before


def test_out_that_cannot_be_written(tmp_path, capsys, tiny_target):
    (tmp_path / "a_file").write_text("not a folder")
    before = snapshot(tmp_path)
    run = ovbuild(capsys, "export", "-m", tiny_target, tmp_path / "a_file" / "out", "--target-layer-ids", "1")
    assert_clean_error(run, "a_file/out: cannot write here (Not a directory)")
    assert snapshot(tmp_path) == before


def test_taps_given_twice_through_the_api(tmp_path, tiny_target, tiny_draft):
    with pytest.raises(ConfigError, match="--target-layer-ids and --draft-of both set the target's taps"):
        export(tiny_target, tmp_path / "out", target_layer_ids=[1], draft_of=tiny_draft)
    assert list(tmp_path.iterdir()) == []


def test_out_replacing_its_own_checkpoint_is_refused(tmp_path, capsys, tiny_draft, tiny_target):
    out = tmp_path / "out"
    assert ovbuild(capsys, "export", "-m", tiny_draft, out, "--target-model", tiny_target).code == 0
    shutil.copytree(tiny_draft, out / "draft")
    before = snapshot(tmp_path)
    run = ovbuild(capsys, "export", "-m", out / "draft", out, "--target-model", tiny_target, "--overwrite")
    assert_clean_error(run, "out: would replace the checkpoint it is exported from")
    assert snapshot(tmp_path) == before

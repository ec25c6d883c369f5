"""A draft and a target that do not belong together, or folders of the wrong kind, are refused at load with one line
naming the folders, from rt_info and, for exports made before a key existed, from IR shapes and config.json."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from ovbuild.errors import CompatibilityError, ExportError, RequestError
from ovbuild.graph.dflash import build_dflash_draft
from ovbuild.graph.genai.draft import build_genai_draft
from ovbuild.graph.genai.target import build_genai_target
from ovbuild.graph.target import build_target
from ovbuild.ir import save_ir
from ovbuild.runtime.model.paged_model import PagedModel
from ovbuild.runtime.pipeline import Pipeline
from ovbuild.targets import load_target
from ovbuild.testing import write_tiny_target
from ovbuild.weights.checkpoint import Checkpoint

from export_helpers import assert_clean_error, ovbuild

EXPORT_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "config.json")
TAPS = (1, 3, 5)  # the tiny draft's


def export_target(folder: Path, ckpt: Path, taps: tuple[int, ...] = TAPS) -> Path:
    cfg, weights = load_target(Checkpoint.open(ckpt))
    save_ir(build_target(cfg, weights, taps), folder / "openvino_model.xml")
    for name in EXPORT_FILES:
        shutil.copy(ckpt / name, folder / name)
    return folder


def strip_rt_info(folder: Path, *keys: str) -> Path:
    """The same IR as an older ovbuild wrote it: without the given `ovbuild/` rt_info keys."""
    xml = folder / "openvino_model.xml"
    text = xml.read_text()
    for key in keys:
        text, n = re.subn(rf"\s*<{key} value=\"[^\"]*\" />", "", text)
        assert n == 1, f"{key} not found in {xml}"
    xml.write_text(text)
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory, tiny_target, target, draft):
    """The tiny pair, targets of another hidden size and vocabulary (same taps), and GenAI-form folders."""
    root = tmp_path_factory.mktemp("pairs")
    (tcfg, tweights), (dcfg, dweights) = target, draft
    save_ir(build_dflash_draft(dcfg, dweights, tweights), root / "draft" / "openvino_model.xml")
    save_ir(build_genai_target(tcfg, tweights), root / "genai_target" / "openvino_model.xml")
    save_ir(build_genai_draft(dcfg, dweights), root / "genai_draft" / "openvino_model.xml")
    return {
        "target": export_target(root / "target", tiny_target),
        "wide": export_target(root / "wide", write_tiny_target(root / "ckpt_wide", hidden_size=96)),
        "vocab": export_target(root / "vocab", write_tiny_target(root / "ckpt_vocab", vocab_size=300)),
        "draft": root / "draft",
        "genai_target": root / "genai_target",
        "genai_draft": root / "genai_draft",
    }


@pytest.fixture
def no_compile(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model was compiled before the folders were checked")

    monkeypatch.setattr(PagedModel, "__init__", refuse)


def generate(capsys, target: Path, draft: Path | None = None):
    extra = ["--draft", draft] if draft is not None else []
    return ovbuild(capsys, "generate", "--target", target, *extra, "--prompt", "hi", "--max-new-tokens", 2)


def test_hidden_size_mismatch_names_both_folders(folders, capsys, no_compile):
    wide, draft = folders["wide"], folders["draft"]
    run = generate(capsys, wide, draft)
    message = f"draft {draft} was exported for a target of hidden size 64 but target {wide} has hidden size 96"
    assert_clean_error(run, message)


def test_vocabulary_mismatch_names_both_folders(folders, capsys, no_compile):
    vocab, draft = folders["vocab"], folders["draft"]
    run = generate(capsys, vocab, draft)
    assert_clean_error(run, f"draft {draft} has a vocabulary of 320 tokens but target {vocab} has 300")


def test_tap_layers_mismatch_names_both_folders(folders, tiny_target, tmp_path, capsys, no_compile):
    other = export_target(tmp_path / "other_taps", tiny_target, taps=(0, 2, 4))
    run = generate(capsys, other, folders["draft"])
    assert_clean_error(run, f"draft {folders['draft']} reads target layers [1, 3, 5] but target {other} was")


def test_exports_without_the_keys_are_still_checked_from_their_shapes(folders, tmp_path, capsys, no_compile):
    """Old exports: no hidden-size or vocabulary keys, so the tap width and the logits width decide."""
    for name in ("wide", "vocab", "draft"):
        shutil.copytree(folders[name], tmp_path / name)
    wide = strip_rt_info(tmp_path / "wide", "hidden_size", "vocab_size", "context_length")
    vocab = strip_rt_info(tmp_path / "vocab", "hidden_size", "vocab_size", "context_length")
    draft = strip_rt_info(tmp_path / "draft", "target_hidden_size", "vocab_size", "hidden_size")
    run = generate(capsys, wide, draft)
    assert_clean_error(run, f"draft {draft} reads taps 192 wide but target {wide} gives taps 288 wide")
    run = generate(capsys, vocab, draft)
    assert_clean_error(run, f"draft {draft} has a vocabulary of 320 tokens but target {vocab} has 300")


def test_exports_without_context_length_read_it_from_config_json(folders, tmp_path):
    shutil.copytree(folders["target"], tmp_path / "target")
    target = strip_rt_info(tmp_path / "target", "context_length")
    pipeline = Pipeline(target)
    assert pipeline.max_model_len == 4096  # config.json's max_position_embeddings
    with pytest.raises(RequestError, match="beyond max_model_len 4096"):
        pipeline.generate(["hi"], 4095)


def test_genai_folders_and_swapped_folders_say_what_they_are(folders, capsys, no_compile):
    genai_target, genai_draft = folders["genai_target"], folders["genai_draft"]
    for folder in (genai_target, genai_draft):
        run = generate(capsys, folder)
        assert_clean_error(run, f"{folder}: this is a --format genai export, for OpenVINO GenAI; ovbuild runs")
    run = generate(capsys, folders["target"], genai_draft)
    assert_clean_error(run, f"{genai_draft}: this is a --format genai export")
    run = generate(capsys, folders["draft"])
    assert_clean_error(run, f"{folders['draft']}: this is an exported draft, not a target")
    run = generate(capsys, folders["target"], folders["target"])
    assert_clean_error(run, f"{folders['target']}: this is an exported target, not a draft")


def test_python_api_raises_the_same_typed_errors(folders, no_compile):
    with pytest.raises(CompatibilityError, match="was exported for a target of hidden size 64"):
        Pipeline(folders["wide"], folders["draft"])
    with pytest.raises(ExportError, match="this is an exported draft, not a target"):
        Pipeline(folders["draft"])


def test_the_matching_pair_still_runs(folders):
    (request,), _ = Pipeline(folders["target"], folders["draft"]).generate(["hi"], 4)
    assert len(request.generated) == 4

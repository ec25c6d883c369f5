"""`ovbuild export` / `ovbuild inspect` on the tiny checkpoints: exported IRs equal the in-memory build and match the
numpy reference, the folder holds everything a runtime needs, every weight format, overwrite, progress."""

from __future__ import annotations

import gc
import importlib.util
import json
import shutil

import numpy as np
import openvino as ov
import pytest
from tokenizers import Tokenizer

from ovbuild import __version__
from ovbuild.export.inspection import constants
from ovbuild.export.weight_formats import WEIGHT_FORMATS
from ovbuild.families import load_draft
from ovbuild.graph.dflash import build_dflash_draft
from ovbuild.graph.target import build_target
from ovbuild.graph.weights import WeightPolicy
from ovbuild.ir import core, read_ir
from ovbuild.ir.rt_info import flat_rt_info, get_rt_info
from ovbuild.reference.dflash import DFlashReference
from ovbuild.reference.qwen3 import Qwen3Reference
from ovbuild.runtime.model.paged_model import PagedModel
from ovbuild.testing import F32_NMSE
from ovbuild.weights.checkpoint import Checkpoint
from ovbuild.weights.safetensors_file import SafetensorsFile, write_safetensors
from ovbuild.weights.tensor import WeightTensor

from export_helpers import DRAFT_SCHEDULE, TARGET_SCHEDULE, assert_clean_error, ovbuild, snapshot
from paged_helpers import run_draft, run_target

TAPS = (1, 3, 5)  # the tiny draft's target_layer_ids
TOKENIZER_IRS = {"openvino_tokenizer.xml", "openvino_detokenizer.xml"}
# Integer formats only have to be sane here; the compression tests own their precise figures.
# measured: keep / fp32 1e-13, fp16 8.7e-8, int8 3.0e-4, int4 1.7e-2 (the 2-layer bf16 draft)
NMSE_BANDS = {"keep": F32_NMSE, "fp32": F32_NMSE, "fp16": 1e-6, "int8": 3e-3, "int4": 0.2}


@pytest.fixture(scope="module")
def exports(tmp_path_factory, tiny_target, tiny_draft):
    """The tiny target (taps from the draft's config) and the tiny draft, exported once in their stored precision."""
    from ovbuild.cli import main

    root = tmp_path_factory.mktemp("exports")
    target_args = ["-m", str(tiny_target), str(root / "target"), "--draft-of", str(tiny_draft)]
    draft_args = ["-m", str(tiny_draft), str(root / "draft"), "--target-model", str(tiny_target)]
    for args in (target_args, draft_args):
        assert main(["export", *args, "--weight-format", "keep", "--quiet"]) == 0
    return root


def paged(model: ov.Model) -> PagedModel:
    return PagedModel(model, kv_cache_precision="f32")


def assert_same_outputs(a, b) -> None:
    for call_a, call_b in zip(a.ir, b.ir, strict=True):
        for seq in call_a:
            for name in call_a[seq]:
                assert np.array_equal(call_a[seq][name], call_b[seq][name]), f"{name} of sequence {seq} differs"


def test_exported_target_equals_in_memory_build_and_matches_reference(exports, target):
    cfg, weights = target
    ref = Qwen3Reference(cfg, weights)
    from_disk = run_target(paged(read_ir(exports / "target")), ref, TAPS, TARGET_SCHEDULE)
    in_memory = run_target(paged(build_target(cfg, weights, TAPS)), ref, TAPS, TARGET_SCHEDULE)
    assert_same_outputs(from_disk, in_memory)
    for name in ("logits", "hidden_states"):
        assert from_disk.nmse(name) < F32_NMSE, f"exported target {name} NMSE {from_disk.nmse(name):.2e}"


def test_exported_draft_equals_in_memory_build_and_matches_reference(exports, target, draft):
    dcfg, dweights = draft
    ref = DFlashReference(dcfg, dweights, target[1])
    from_disk = run_draft(paged(read_ir(exports / "draft")), ref, DRAFT_SCHEDULE)
    in_memory = run_draft(paged(build_dflash_draft(dcfg, dweights, target[1])), ref, DRAFT_SCHEDULE)
    assert_same_outputs(from_disk, in_memory)
    for name in ("logits", "last_hidden_state"):
        assert from_disk.nmse(name) < F32_NMSE, f"exported draft {name} NMSE {from_disk.nmse(name):.2e}"


def can_convert_tokenizers() -> bool:
    return importlib.util.find_spec("openvino_tokenizers") is not None


def test_target_folder_holds_configs_tokenizer_and_provenance(exports, tiny_target):
    out = exports / "target"
    for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (out / name).read_bytes() == (tiny_target / name).read_bytes(), name
    assert bool(TOKENIZER_IRS & {p.name for p in out.iterdir()}) == can_convert_tokenizers()
    if can_convert_tokenizers():  # optional dependencies: the converted tokenizer must encode like the source one
        encode = core().compile_model(out / "openvino_tokenizer.xml")
        text = "hello, wörld"
        expected = Tokenizer.from_file(str(tiny_target / "tokenizer.json")).encode(text).ids
        assert encode([text])["input_ids"][0].tolist() == expected
    rt = flat_rt_info(read_ir(out))
    expected = {
        "ovbuild/version": __version__,
        "ovbuild/openvino_version": ov.get_version(),
        "ovbuild/kind": "target",
        "ovbuild/family": "qwen3",
        "ovbuild/source": str(tiny_target.resolve()),
        "ovbuild/revision": "local",
        "ovbuild/weight_format": "keep",
        "ovbuild/ir_format": "paged",
        "ovbuild/target_layer_ids": "1,3,5",
    }
    assert {k: rt.get(k) for k in expected} == expected


def test_draft_folder_holds_config_and_provenance(exports, tiny_draft, tiny_target):
    out = exports / "draft"
    assert {p.name for p in out.iterdir()} == {"config.json", "openvino_model.xml", "openvino_model.bin"}
    assert (out / "config.json").read_bytes() == (tiny_draft / "config.json").read_bytes()
    rt = flat_rt_info(read_ir(out))
    assert rt["ovbuild/source"] == str(tiny_draft.resolve()) and rt["ovbuild/target_source"] == str(tiny_target)
    assert rt["ovbuild/kind"] == "draft" and rt["ovbuild/family"] == "dflash"


def test_default_weight_formats(tmp_path, capsys, tiny_draft, tiny_target):
    """Targets keep the checkpoint precision; drafts take int8."""
    ovbuild(capsys, "export", "-m", tiny_draft, tmp_path / "draft", "--target-model", tiny_target)
    ovbuild(capsys, "export", "-m", tiny_target, tmp_path / "target")
    expected = {"draft": "int8", "target": "keep"}
    for kind, fmt in expected.items():
        assert flat_rt_info(read_ir(tmp_path / kind))["ovbuild/weight_format"] == fmt, kind


@pytest.mark.parametrize("fmt", WEIGHT_FORMATS)
def test_every_weight_format(tmp_path, capsys, fmt, tiny_draft_bf16, tiny_target, target):
    """A bf16 draft with an f32 target: every format stores matrices as asked and stays within its NMSE band."""
    out = tmp_path / "out"
    options = ["--weight-format", fmt, *(["--group-size", "32"] if fmt == "int4" else [])]  # groups must divide 64
    run = ovbuild(capsys, "export", "-m", tiny_draft_bf16, out, "--target-model", tiny_target, *options)
    assert run.code == 0, run.err
    model = read_ir(out)
    stored = constants(model)
    # two layers of five weight constants (q; k and v stacked; o; gate and up stacked; down), fc, the target's
    # embedding and lm_head
    matrices = 2 * 5 + 3
    if fmt == "keep":
        assert stored["bf16"][0] == 2 * 5 + 1 and "f16" not in stored  # the f32 target's tables stay f32
    elif fmt in ("fp16", "fp32"):
        narrow = {"fp16": "f16", "fp32": None}[fmt]
        assert "bf16" not in stored and (narrow is None or stored[narrow][0] == matrices), stored
    else:
        assert {"u8", "i8", "u4", "i4"} & set(stored), stored
    dcfg, dweights = load_draft(Checkpoint.open(tiny_draft_bf16))
    out_nmse = run_draft(paged(model), DFlashReference(dcfg, dweights, target[1]), DRAFT_SCHEDULE).nmse("logits")
    print(f"{fmt}: exported draft logits NMSE vs f32 reference {out_nmse:.2e}")
    assert out_nmse < NMSE_BANDS[fmt], f"{fmt} draft logits NMSE {out_nmse:.2e}"


def test_muse_glimmer_layout_exports_like_dflash(tmp_path, capsys, exports, tiny_draft, tiny_target):
    """The Muse-Glimmer assistant is DFlash v1 under other names and flat keys: same weights, same .bin."""
    folder = tmp_path / "glimmer"
    folder.mkdir()
    config = json.loads((tiny_draft / "config.json").read_text())
    config |= {"architectures": ["MuseGlimmerAssistantModel"], **config.pop("dflash_config")}
    (folder / "config.json").write_text(json.dumps(config))
    renames = {"fc.weight": "encoder.fc.weight", "hidden_norm.weight": "encoder.output_norm_enc.weight"}
    source = SafetensorsFile(tiny_draft / "model.safetensors")
    tensors = {renames.get(n, n): source.read(n) for n in source.tensors}
    write_safetensors(folder / "model.safetensors", {n: WeightTensor(n, t.dtype, t.array) for n, t in tensors.items()})
    run = ovbuild(
        capsys, "export", "-m", folder, tmp_path / "out", "--target-model", tiny_target, "--weight-format", "keep"
    )
    assert run.code == 0, run.err
    assert "exported draft (dflash, " in run.out
    expected = (exports / "draft" / "openvino_model.bin").read_bytes()
    assert (tmp_path / "out" / "openvino_model.bin").read_bytes() == expected


def test_inspect_describes_and_loads_an_export(capsys, exports):
    run = ovbuild(capsys, "inspect", exports / "target")
    assert run.code == 0 and run.err == "", run.err
    for line in (
        "kind target, family qwen3, weight format keep, IR format paged",
        "openvino_model.xml: reads and compiles on CPU",
        "    input_ids                i64      [?]",
        "    hidden_states            f32      [?,192]",
        "    logits                   f32      [?,320]",
        "    ovbuild/target_layer_ids = 1,3,5",
        "    pa/num_kv_heads = 2",
        "  tokenizer.json",
    ):
        assert line in run.out, f"{line!r} missing from:\n{run.out}"
    run = ovbuild(capsys, "inspect", exports / "draft")
    assert "kind draft, family dflash" in run.out and "    candidate_indices        i64      [?]" in run.out


def test_inspect_fails_cleanly_on_a_broken_folder(tmp_path, capsys, exports):
    broken = tmp_path / "broken"
    shutil.copytree(exports / "draft", broken)
    weights = broken / "openvino_model.bin"
    weights.write_bytes(weights.read_bytes()[:1000])
    assert_clean_error(ovbuild(capsys, "inspect", broken), "broken/openvino_model.xml: cannot be read")
    assert_clean_error(ovbuild(capsys, "inspect", tmp_path), "not an exported folder (no openvino_model.xml)")


def test_existing_out_is_kept_without_overwrite(tmp_path, capsys, tiny_target):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    run = ovbuild(capsys, "export", "-m", tiny_target, out)
    assert_clean_error(run, "out: already exists (pass --overwrite to replace it)")
    assert snapshot(tmp_path) == {"out", "out/keep.txt"}
    run = ovbuild(capsys, "export", "-m", tiny_target, out, "--overwrite")
    assert_clean_error(run, "out: is not an exported folder (no openvino_model.xml); refusing to replace it")
    assert (out / "keep.txt").read_text() == "mine"


def test_overwrite_replaces_an_export_and_a_failure_keeps_the_old_one(
    tmp_path, capsys, monkeypatch, tiny_draft, tiny_target
):
    out = tmp_path / "out"
    args = ["export", "-m", tiny_draft, out, "--target-model", tiny_target, "--overwrite"]
    assert ovbuild(capsys, *args, "--weight-format", "fp32").code == 0
    (out / "marker").write_text("old export")
    assert ovbuild(capsys, *args, "--weight-format", "fp16").code == 0
    assert not (out / "marker").exists()
    assert flat_rt_info(read_ir(out))["ovbuild/weight_format"] == "fp16"
    assert {p.split("/")[0] for p in snapshot(tmp_path)} == {"out"}

    (out / "marker").write_text("old export")
    before = snapshot(tmp_path)

    def disk_full(model, path):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("ovbuild.export.package.save_ir", disk_full)
    run = ovbuild(capsys, *args)
    assert_clean_error(run, "openvino_model.xml: cannot be written (No space left on device)")
    assert snapshot(tmp_path) == before and (out / "marker").read_text() == "old export"


def test_progress_and_log_lines_only_on_a_terminal(tmp_path, capsys, monkeypatch, tiny_draft, tiny_target):
    args = ["export", "-m", tiny_draft, tmp_path / "out", "--target-model", tiny_target, "--overwrite"]
    quiet = ovbuild(capsys, *args, "--quiet")
    assert quiet.code == 0 and quiet.out == "" and quiet.err == ""
    piped = ovbuild(capsys, *args)
    assert piped.err == "" and piped.out.startswith("exported draft (dflash, ")
    monkeypatch.setattr("ovbuild.export.progress.on_terminal", lambda: True)
    monkeypatch.setattr("ovbuild.export.api.on_terminal", lambda: True)
    monkeypatch.setattr("ovbuild.commands.export.on_terminal", lambda: True)
    tty = ovbuild(capsys, *args)
    assert "ovbuild: exporting draft" in tty.err and "ovbuild: writing openvino_model.xml" in tty.err
    assert "building draft dflash [" in tty.err and "2/2 layers" in tty.err


def test_converted_weights_outlive_the_arrays_they_came_from():
    """A cast Constant must own its data: OpenVINO keeps no reference to a numpy array it shares."""
    values = np.random.default_rng(0).standard_normal((512, 1024)).astype(np.float32)

    def build() -> ov.Output:
        return WeightPolicy("fp16").matrix(WeightTensor("w", "f32", values.copy()), "w")

    node = build().get_node().input_value(0).get_node()
    gc.collect()
    np.full((512, 1024), 7.0, np.float32)  # reuse freed memory, if any was freed
    assert np.array_equal(node.get_data(), values.astype(np.float16))


def test_released_pages_read_back_unchanged(tiny_draft):
    """Dropping a tensor's mapped pages only costs a re-read: views made before stay valid and equal."""
    file = SafetensorsFile(tiny_draft / "model.safetensors")
    view = file.read("fc.weight").array
    before = view.copy()
    file.release("fc.weight")
    assert np.array_equal(view, before)


def test_markov_head_rt_info_says_it_is_not_compressed(tmp_path, tiny_target, capsys):
    from ovbuild.testing.tiny_dflash2 import write_tiny_dflash2

    out = tmp_path / "v2"
    ckpt = write_tiny_dflash2(tmp_path / "ckpt")
    run = ovbuild(capsys, "export", "-m", ckpt, out, "--target-model", tiny_target, "--weight-format", "int8")
    assert run.code == 0, run.err
    assert get_rt_info(read_ir(out), "ovbuild/weight_format") == "int8"
    assert get_rt_info(read_ir(out / "openvino_markov_head_model.xml"), "ovbuild/weight_format") == "keep"

"""Exporting a vision-language target: its language model takes image embeddings and three-axis positions, or, with
--no-vision, is the text model it was before."""

from __future__ import annotations

from ovbuild.ir import ImageKeys, read_ir
from ovbuild.ir.ports import IMAGE_ROWS, MROPE_OFFSETS, PLACED_EMBEDS
from ovbuild.testing.tiny_hybrid import write_tiny_hybrid_target
from ovbuild.testing.tiny_minicpm_vision import write_tiny_minicpm_vision

from export_helpers import ovbuild

IMAGE_PORTS = {str(MROPE_OFFSETS), str(PLACED_EMBEDS), str(IMAGE_ROWS)}


def test_vision_language_targets_export_with_image_inputs(tmp_path, capsys):
    for name, write in (("qwen3_5", write_tiny_hybrid_target), ("minicpmv", write_tiny_minicpm_vision)):
        ckpt = write(tmp_path / name)
        run = ovbuild(capsys, "export", "-m", ckpt, tmp_path / f"{name}_ir", "--weight-format", "keep", "--quiet")
        assert run.code == 0, run.err
        model = read_ir(tmp_path / f"{name}_ir")
        inputs = {p.get_any_name(): p for p in model.inputs}
        assert set(inputs) >= IMAGE_PORTS
        assert str(inputs[MROPE_OFFSETS].get_partial_shape()) == "[?,3]"
        assert str(inputs[PLACED_EMBEDS].get_partial_shape()) == "[?,64]"
        assert ImageKeys.from_model(model) == ImageKeys((1, 1, 2), True)
        run = ovbuild(capsys, "inspect", tmp_path / f"{name}_ir")
        assert run.code == 0 and "image_embeds" in run.out, run.err

        run = ovbuild(capsys, "export", "-m", ckpt, tmp_path / f"{name}_text", "--no-vision", "--quiet")
        assert run.code == 0, run.err
        text = read_ir(tmp_path / f"{name}_text")
        assert not IMAGE_PORTS & {p.get_any_name() for p in text.inputs}
        assert ImageKeys.from_model(text) is None


def test_a_text_only_checkpoint_takes_no_images(tmp_path, capsys):
    ckpt = write_tiny_hybrid_target(tmp_path / "t", text_only=True)
    run = ovbuild(capsys, "export", "-m", ckpt, tmp_path / "ir", "--quiet")
    assert run.code == 0, run.err
    assert not IMAGE_PORTS & {p.get_any_name() for p in read_ir(tmp_path / "ir").inputs}

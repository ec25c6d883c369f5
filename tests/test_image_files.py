"""Image files all the way through: `LLM.generate(text, images=[path])` and `ovbuild generate --image PATH` process
each image as the target's processor does, encode it with the exported vision tower, and place the embeddings at
the prompt's placeholder tokens, Qwen3.5's and MiniCPM-V 4.7's (canvas positions); the draft changes nothing."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from ovbuild.export import export
from ovbuild.ir import VISION_FILE, core, read_ir
from ovbuild.ir.ports import GRID_THW, IMAGE_EMBEDS, PIXEL_VALUES
from ovbuild.llm import LLM
from ovbuild.processor import QwenImageProcessor, decode_image
from ovbuild.runtime.canvas_positions import canvas_positions
from ovbuild.runtime.images import ImageInput, ImagePrompt
from ovbuild.testing import F32_NMSE, nmse
from ovbuild.testing.tiny_hybrid import TINY_HYBRID, write_tiny_hybrid_dflash, write_tiny_hybrid_target
from ovbuild.testing.tiny_minicpm_vision import write_tiny_minicpm_vision_for_images

from export_helpers import assert_clean_error, ovbuild

IMAGE, START, END = (
    TINY_HYBRID["image_token_id"],
    TINY_HYBRID["vision_start_token_id"],
    TINY_HYBRID["vision_end_token_id"],
)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """(target folder, draft folder, two image files of different sizes)."""
    root = tmp_path_factory.mktemp("image_files")
    target, draft = write_tiny_hybrid_target(root / "ct"), write_tiny_hybrid_dflash(root / "cd")
    export(target, root / "t", draft_of=draft, weight_format="keep", quiet=True)
    export(draft, root / "d", target_model=target, weight_format="keep", quiet=True)
    rng = np.random.default_rng(0)
    pictures = []
    for name, size in (("wide.png", (12, 28)), ("tall.png", (30, 14))):
        Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8)).save(root / name)
        pictures.append(root / name)
    return root / "t", root / "d", pictures


def tower_embeddings(folder, picture) -> tuple[np.ndarray, np.ndarray]:
    """The exported tower's embeddings of one image, run here directly, and its grid."""
    processed = QwenImageProcessor.from_folder(folder).process(decode_image(picture))
    compiled = core().compile_model(read_ir(folder / VISION_FILE), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    return compiled({PIXEL_VALUES: processed.pixel_values, GRID_THW: processed.grid})[IMAGE_EMBEDS], processed.grid


def test_the_prompter_places_the_towers_embeddings(folders):
    target, _, pictures = folders
    llm = LLM(target)
    ids, shown = llm.image_prompter().prompt("What is this?", [str(p) for p in pictures])
    assert ids[:1] == [START] and ids[-len("What is this?") :] == list(b"What is this?")
    for image, picture in zip(shown.images, pictures, strict=True):
        embeds, grid = tower_embeddings(target, picture)
        t, h, w = grid[0]
        assert image.grid == (t, h // 2, w // 2)
        # both images ran in one call there, this one alone here: other kernel shapes, the same rows
        error = nmse(image.embeds, embeds)
        assert error < F32_NMSE, f"embeddings placed vs the tower's own: NMSE {error:.2e}"
        assert ids[image.start - 1] == START and ids[image.end] == END
        assert set(ids[image.start : image.end]) == {IMAGE}
    assert shown.images[0].grid != shown.images[1].grid


def test_llm_generate_with_image_files(folders):
    target, draft, pictures = folders
    llm = LLM(target, draft)
    files = [str(p) for p in pictures]
    kw = dict(max_new_tokens=12, ignore_eos=True)
    answer = llm.generate("What is this?", images=files, **kw)
    assert answer == llm.generate("What is this?", images=files, use_draft=False, **kw)
    ids, shown = llm.image_prompter().prompt("What is this?", files)
    assert answer == llm.generate(ids, images=list(shown.images), **kw)  # the same as embeddings given directly
    blank = [ImageInput(i.start, np.zeros_like(i.embeds), i.grid) for i in shown.images]
    assert answer != llm.generate(ids, images=blank, **kw)  # the embeddings, not the placeholders, answer
    both = llm.generate(["What is this?", "And this?"], images=[files, files[1:]], **kw)
    assert both[0] == answer


def test_generate_command_takes_image_files(folders, tmp_path, capsys):
    target, draft, pictures = folders
    out = tmp_path / "out.json"
    common = ["generate", "--target", target, "--prompt", "What is this?", "--max-new-tokens", "12", "--ignore-eos"]
    images = [a for p in pictures for a in ("--image", p)]
    run = ovbuild(capsys, *common, *images, "--draft", draft, "--json", out)
    assert run.code == 0, run.err
    llm = LLM(target)
    expected = llm.generate("What is this?", images=[str(p) for p in pictures], max_new_tokens=12, ignore_eos=True)
    assert json.loads(out.read_text())["requests"][0]["text"] == expected
    run = ovbuild(capsys, *common, "--prompt", "two prompts", *images)
    assert_clean_error(run, "--image goes with one text prompt")


def test_a_folder_without_a_tower_refuses_image_files(folders, tmp_path, capsys):
    _, _, pictures = folders
    write_tiny_hybrid_target(tmp_path / "c")
    export(tmp_path / "c", tmp_path / "t", weight_format="keep", quiet=True, vision=False)
    run = ovbuild(capsys, "generate", "--target", tmp_path / "t", "--prompt", "x", "--image", pictures[0])
    assert_clean_error(run, f"no vision tower ({VISION_FILE})")


def test_minicpmv_image_files_take_the_canvas_layout(tmp_path):
    """A MiniCPM-V 4.7 target: an image becomes an overview and 2 x 2 slices, each crop a run of its own; every
    crop's rows are the tower's, the positions are the canvas layout, and the embeddings change the answer."""
    ckpt = write_tiny_minicpm_vision_for_images(tmp_path / "c")
    export(ckpt, tmp_path / "t", weight_format="keep", quiet=True)
    picture = tmp_path / "a.png"
    Image.fromarray(np.random.default_rng(1).integers(0, 256, (24, 40, 3), dtype=np.uint8)).save(picture)
    llm = LLM(tmp_path / "t")
    ids, shown = llm.image_prompter().prompt("What?", [str(picture)])
    prompter = llm.image_prompter()
    types = [int(t == prompter.image_id) for t in ids]
    processed = prompter.processor.process(decode_image(picture))
    assert len(shown.images) == 1 + 4 and processed.slices == (2, 2)  # the overview, then the slices row by row
    sizes = [tuple(int(v) for v in g) for g in processed.grid]
    positions, delta = canvas_positions(ids, types, sizes, prompter.markers, 4)
    assert np.array_equal(shown.positions, positions) and shown.delta == delta
    assert not np.array_equal(positions[1], positions[0])  # not text positions: the crops spread over the canvas
    rows = np.concatenate([image.embeds for image in shown.images])
    encoded = prompter.encoder.encode([(processed.pixel_values, processed.grid)])[0]
    error = nmse(rows, encoded)
    assert error < F32_NMSE, f"placed crops vs the tower's rows: NMSE {error:.2e}"
    for image in shown.images:
        assert set(ids[image.start : image.end]) == {prompter.image_id}
    kw = dict(max_new_tokens=8, ignore_eos=True)
    answer = llm.generate("What?", images=[str(picture)], **kw)
    assert answer == llm.generate(ids, images=shown, **kw)
    blank = ImagePrompt(tuple(ImageInput(i.start, 0 * i.embeds, i.grid) for i in shown.images), positions, delta)
    assert answer != llm.generate(ids, images=blank, **kw)

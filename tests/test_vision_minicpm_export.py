"""MiniCPM-V 4.7's vision tower through the export: declared in ovbuild/targets.py, written beside the target as
openvino_vision_model.xml in the config's downsample mode (in float whatever the weight format), left out by
--no-vision, shown by `ovbuild inspect`, and the IR read back from the folder equal to the numpy reference on
several images packed into one call."""

from __future__ import annotations

import numpy as np
import pytest

from ovbuild.export.api import export
from ovbuild.ir import VISION_FILE, VisionIR, WeightStorage, core, read_ir
from ovbuild.ir.ports import IMAGE_EMBEDS, IMAGE_TOKEN_COUNTS, MINICPM_PIXEL_VALUES, MINICPM_TARGET_SIZES
from ovbuild.targets import MINICPMV4_7_VISION, QWEN3_5, find_vision_tower
from ovbuild.testing import F32_NMSE, nmse
from ovbuild.testing.references import VISION_REFERENCES
from ovbuild.testing.tiny_minicpm_vision import write_tiny_minicpm_vision
from ovbuild.weights.checkpoint import Checkpoint

from export_helpers import ovbuild

# (h, w) patch grids packed into one call: taller than wide, wider than tall, small, larger than the position table.
SIZES = [(8, 12), (12, 8), (4, 4), (20, 16)]
# name -> (kind, config's downsample_mode, weight format of the target, seed)
EXPORTS = {"1b": ("1b", "16x", "keep", 7), "a3b": ("a3b", "16x", "int8", 8), "1b_4x": ("1b", "4x", "keep", 9)}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """name -> (checkpoint, exported folder)."""
    root = tmp_path_factory.mktemp("minicpm_export")
    out = {}
    for name, (kind, mode, weight_format, seed) in EXPORTS.items():
        ckpt = write_tiny_minicpm_vision(root / f"{name}_ckpt", kind, seed=seed, top={"downsample_mode": mode})
        out[name] = (ckpt, export(ckpt, root / name, weight_format=weight_format, quiet=True).out)
    return out


def encode(folder, pixel_values: np.ndarray, sizes) -> tuple[np.ndarray, np.ndarray]:
    """The exported vision IR, read from `folder` and compiled with f32 inference, on one packed call."""
    compiled = core().compile_model(read_ir(folder / VISION_FILE), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    out = compiled({MINICPM_PIXEL_VALUES: pixel_values, MINICPM_TARGET_SIZES: np.array(sizes, np.int64)})
    return out[compiled.output(IMAGE_EMBEDS)], out[compiled.output(IMAGE_TOKEN_COUNTS)]


@pytest.mark.parametrize("name", list(EXPORTS))
def test_the_exported_ir_matches_the_reference(folders, name):
    checkpoint, folder = folders[name]
    ckpt = Checkpoint.open(checkpoint)
    tower = find_vision_tower(ckpt.config, str(ckpt.config_path))
    cfg, weights = tower.load(ckpt)
    count = sum(h * w for h, w in SIZES)
    rng = np.random.default_rng(11)
    pixels = rng.standard_normal((1, cfg.num_channels, cfg.patch_size, count * cfg.patch_size)).astype(np.float32)
    embeds, counts = encode(folder, pixels, SIZES)
    expected = VISION_REFERENCES[tower.name](cfg, weights).forward(pixels, np.array(SIZES))
    assert counts.tolist() == [cfg.tokens(h, w) for h, w in SIZES] and embeds.shape == expected.shape
    error = nmse(embeds, expected)
    assert error < F32_NMSE, f"{name}: exported MiniCPM-V vision IR NMSE {error:.3e} over {len(SIZES)} packed images"


@pytest.mark.parametrize(("name", "per_token", "multiple"), [("1b", 16, 4), ("a3b", 16, 4), ("1b_4x", 4, 2)])
def test_the_ir_records_the_configs_mode_in_float(folders, name, per_token, multiple):
    _, folder = folders[name]
    record = VisionIR.from_model(read_ir(folder / VISION_FILE))
    mode = EXPORTS[name][1]
    assert record == VisionIR("minicpmv4_7_vision", 3, 32, 4, 3, 2, 256, 64, per_token, multiple, None, mode)
    assert WeightStorage.from_model(read_ir(folder / VISION_FILE)).weight_format == "keep"
    assert WeightStorage.from_model(read_ir(folder)).weight_format == EXPORTS[name][2]


def test_no_vision_leaves_the_tower_out_and_inspect_shows_it(folders, tmp_path, capsys):
    checkpoint, folder = folders["1b"]
    run = ovbuild(capsys, "export", "-m", checkpoint, tmp_path / "cli", "--no-vision", "--quiet")
    assert run.code == 0 and not (tmp_path / "cli" / VISION_FILE).exists()
    assert (tmp_path / "cli" / "openvino_model.xml").exists()
    run = ovbuild(capsys, "inspect", folder)
    assert run.code == 0, run.err
    assert f"{VISION_FILE}: reads and compiles on CPU" in run.out
    assert "vision tower minicpmv4_7_vision: 3 blocks, width 32, 4 heads" in run.out
    assert "patches 2x2 pixels of 3 channels; position grid 16x16" in run.out
    assert "one token of width 64 per 16 patches, downsample 16x (grids in multiples of 8 pixels)" in run.out


def test_the_declared_tiny_checkpoints_carry_the_tower(tmp_path):
    for name in ("minicpmv4_7_1b", "minicpmv4_7_a3b"):
        ckpt = Checkpoint.open(QWEN3_5.tiny[name](tmp_path / name))
        tower = find_vision_tower(ckpt.config, str(ckpt.config_path))
        assert tower is MINICPMV4_7_VISION and tower.load(ckpt)[0].family == tower.name

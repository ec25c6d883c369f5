"""The Qwen3.5-family vision tower (dense and MoE vision-language checkpoints hold the same one): its config read
from `vision_config`, the IR built from the `model.visual.*` tensors against the numpy reference with several images
of different grids packed into one call, clear errors for bad checkpoints, and its export beside the target."""

from __future__ import annotations

import numpy as np
import pytest

from ovbuild.errors import ConfigError, OvbuildError, TensorError, UnsupportedError
from ovbuild.export.api import export
from ovbuild.graph.vision.qwen3_5 import build_qwen_vision
from ovbuild.ir import VISION_FILE, VisionIR, WeightStorage, core, read_ir
from ovbuild.ir.ports import GRID_THW, IMAGE_EMBEDS, PIXEL_VALUES
from ovbuild.reference.vision_qwen import QwenVisionReference, linspace_f32
from ovbuild.targets import VISION_TOWERS, find_vision_tower
from ovbuild.testing import F32_NMSE, nmse
from ovbuild.testing.references import VISION_REFERENCES
from ovbuild.testing.tiny import write_checkpoint
from ovbuild.testing.tiny_hybrid import TINY_HYBRID, write_tiny_hybrid_target
from ovbuild.testing.tiny_moe import write_tiny_moe_target
from ovbuild.testing.tiny_vision import TINY_QWEN_VISION
from ovbuild.weights.checkpoint import Checkpoint
from ovbuild.weights.vision_qwen import load_qwen_vision, parse_qwen_vision_config

from export_helpers import ovbuild

F32 = {"INFERENCE_PRECISION_HINT": "f32"}
# (t, h, w) in patches: non-square, two frames, larger than the 6 x 6 position grid, smaller than it.
GRIDS = np.array([[1, 4, 6], [2, 8, 4], [1, 12, 10], [1, 2, 2]], np.int64)
WRITERS = {"dense": write_tiny_hybrid_target, "moe": write_tiny_moe_target}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("vision_ckpt")
    return {name: write(root / name) for name, write in WRITERS.items()}


def pixels(grids: np.ndarray, width: int, seed: int = 0) -> np.ndarray:
    """Random flattened patches for every image of `grids`: [sum(t * h * w), width]."""
    return np.random.default_rng(seed).standard_normal((int(grids.prod(1).sum()), width)).astype(np.float32)


def encode(model, grids: np.ndarray, values: np.ndarray) -> np.ndarray:
    compiled = core().compile_model(model, "CPU", F32)
    return compiled({PIXEL_VALUES: values, GRID_THW: grids})[IMAGE_EMBEDS]


@pytest.mark.parametrize("layout", list(WRITERS))
def test_packed_images_match_the_reference(checkpoints, layout):
    cfg, weights = load_qwen_vision(Checkpoint.open(checkpoints[layout]))
    values = pixels(GRIDS, cfg.patch_dim)
    out = encode(build_qwen_vision(cfg, weights), GRIDS, values)
    expected = QwenVisionReference(cfg, weights).forward(values, GRIDS)
    assert out.shape == (GRIDS.prod(1).sum() // 4, 64)
    error = nmse(out, expected)
    assert error < F32_NMSE, f"{layout}: vision tower NMSE {error:.3e} over {len(GRIDS)} packed images"


def test_an_image_alone_encodes_as_in_a_pack(checkpoints):
    """Attention stays within each frame of each image: an image's tokens do not depend on its neighbours."""
    cfg, weights = load_qwen_vision(Checkpoint.open(checkpoints["dense"]))
    model = build_qwen_vision(cfg, weights)
    values = pixels(GRIDS, cfg.patch_dim, seed=1)
    packed = encode(model, GRIDS, values)
    patches, tokens = GRIDS.prod(1), GRIDS.prod(1) // 4
    first, first_token = int(patches[:2].sum()), int(tokens[:2].sum())
    alone = encode(model, GRIDS[2:3], values[first : first + patches[2]])
    error = nmse(alone, packed[first_token : first_token + tokens[2]])
    assert error < F32_NMSE, f"an image alone vs packed: NMSE {error:.3e}"


def test_grid_coordinates_follow_torch_linspace():
    """linspace(0, 5, 4) in float32: the second half counted back from the end (5 - step, one ulp above 2 * step,
    as torch's kernel gives it); a single step is 0."""
    step = np.float32(5) / np.float32(3)
    np.testing.assert_array_equal(linspace_f32(6, 4), np.array([0, step, np.float32(5) - step, 5], np.float32))
    assert np.float32(5) - step != 2 * step
    np.testing.assert_array_equal(linspace_f32(6, 1), [0.0])


def test_config_is_read_for_dense_and_moe(checkpoints):
    for layout, folder in checkpoints.items():
        cfg, weights = load_qwen_vision(Checkpoint.open(folder))
        assert cfg.architecture == Checkpoint.open(folder).config["architectures"][0], layout
        assert (cfg.depth, cfg.hidden_size, cfg.num_heads, cfg.head_dim) == (2, 32, 2, 16)
        assert (cfg.patch_size, cfg.temporal_patch_size, cfg.spatial_merge_size) == (2, 2, 2)
        assert (cfg.patch_dim, cfg.grid_side, cfg.out_hidden_size) == (24, 6, 64)
        assert weights.checkpoint_name("layers.1.attn.qkv.bias") == "model.visual.blocks.1.attn.qkv.bias"
        assert weights.checkpoint_name("merger.linear_fc2.weight") == "model.visual.merger.linear_fc2.weight"


def test_absent_keys_take_the_published_defaults():
    cfg = parse_qwen_vision_config({**TINY_HYBRID, "vision_config": {"model_type": "qwen3_5"}}, "c.json")
    assert (cfg.depth, cfg.hidden_size, cfg.intermediate_size, cfg.num_heads) == (27, 1152, 4304, 16)
    assert (cfg.patch_size, cfg.temporal_patch_size, cfg.spatial_merge_size, cfg.grid_side) == (16, 2, 2, 48)
    assert (cfg.hidden_act, cfg.rope_theta, cfg.out_hidden_size) == ("gelu_pytorch_tanh", 10000.0, 3584)


@pytest.mark.parametrize(
    "key, value, error, message",
    [
        ("num_heads", 3, ConfigError, r"vision_config\.num_heads' = 3"),
        ("num_position_embeddings", 40, ConfigError, r"vision_config\.num_position_embeddings' = 40 is not a square"),
        ("hidden_act", "relu6", UnsupportedError, r"vision_config\.hidden_act'.*relu6"),
        ("deepstack_visual_indexes", [1], UnsupportedError, r"vision_config\.deepstack_visual_indexes'"),
        ("patch_size", [2, 4], ConfigError, r"vision_config\.patch_size' must be a positive integer"),
        ("depth", "two", ConfigError, r"vision_config\.depth' must be an integer"),
    ],
)
def test_a_bad_vision_config_key_is_named(key, value, error, message):
    config = {**TINY_HYBRID, "vision_config": {**TINY_QWEN_VISION, key: value}}
    with pytest.raises(error, match=message):
        parse_qwen_vision_config(config, "c.json")


def test_a_missing_vision_config_is_named():
    config = {k: v for k, v in TINY_HYBRID.items() if k != "vision_config"}
    with pytest.raises(ConfigError, match=r"c\.json: key 'vision_config' is missing"):
        parse_qwen_vision_config(config, "c.json")


def rewrite(folder, change) -> None:
    """The checkpoint in `folder` with its tensors passed through `change` (a dict -> dict)."""
    ckpt = Checkpoint.open(folder)
    tensors = change({n: ckpt.get(n).to_f32() for n in ckpt.tensor_names})
    config = ckpt.config
    del ckpt
    (folder / "model.safetensors").unlink()
    write_checkpoint(folder, config, tensors)


def test_missing_and_misshaped_tensors_are_named(tmp_path):
    missing = write_tiny_hybrid_target(tmp_path / "missing")
    rewrite(missing, lambda t: {n: a for n, a in t.items() if n != "model.visual.blocks.1.mlp.linear_fc1.bias"})
    with pytest.raises(TensorError, match=r"'model\.visual\.blocks\.1\.mlp\.linear_fc1\.bias' is missing"):
        build_qwen_vision(*load_qwen_vision(Checkpoint.open(missing)))
    misshaped = write_tiny_hybrid_target(tmp_path / "misshaped")
    name = "model.visual.blocks.0.attn.qkv.weight"
    rewrite(misshaped, lambda t: {**t, name: t[name][:48]})
    with pytest.raises(TensorError, match=r"'model\.visual\.blocks\.0\.attn\.qkv\.weight' has shape \[48, 32\], "):
        build_qwen_vision(*load_qwen_vision(Checkpoint.open(misshaped)))
    # through the export: a clean error and no output folder
    with pytest.raises(OvbuildError, match=r"attn\.qkv\.weight"):
        export(misshaped, tmp_path / "out", quiet=True)
    assert not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def exported(tmp_path_factory, checkpoints):
    root = tmp_path_factory.mktemp("vision_out")
    export(checkpoints["moe"], root / "with", weight_format="int8", quiet=True)
    export(checkpoints["dense"], root / "without", quiet=True, vision=False)
    return root


def test_export_writes_the_vision_ir_in_float(exported, checkpoints):
    model = read_ir(exported / "with" / VISION_FILE)
    record = VisionIR.from_model(model)
    assert (record.family, record.depth, record.patch_size, record.grid_multiple) == ("qwen3_5_vision", 2, 2, 2)
    assert (record.temporal_patch_size, record.out_hidden_size, record.num_position_embeddings) == (2, 64, 36)
    assert (record.patches_per_token, record.downsample_mode) == (4, None)
    assert WeightStorage.from_model(model).weight_format == "keep"  # int8 applies to the language model only
    assert WeightStorage.from_model(read_ir(exported / "with")).weight_format == "int8"
    cfg, weights = load_qwen_vision(Checkpoint.open(checkpoints["moe"]))
    values = pixels(GRIDS, cfg.patch_dim, seed=2)
    error = nmse(encode(model, GRIDS, values), QwenVisionReference(cfg, weights).forward(values, GRIDS))
    assert error < F32_NMSE, f"exported vision IR: NMSE {error:.3e}"


def test_no_vision_leaves_the_tower_out(exported, tmp_path):
    assert not (exported / "without" / VISION_FILE).exists()
    text_only = write_tiny_hybrid_target(tmp_path / "text", text_only=True)
    assert not (export(text_only, tmp_path / "out", quiet=True).out / VISION_FILE).exists()


def test_cli_no_vision_and_inspect_geometry(capsys, exported, checkpoints, tmp_path):
    run = ovbuild(capsys, "export", "-m", checkpoints["dense"], tmp_path / "cli", "--no-vision", "--quiet")
    assert run.code == 0 and not (tmp_path / "cli" / VISION_FILE).exists()
    run = ovbuild(capsys, "inspect", exported / "with")
    assert run.code == 0, run.err
    assert f"{VISION_FILE}: reads and compiles on CPU" in run.out
    assert "vision tower qwen3_5_vision: 2 blocks, width 32, 2 heads" in run.out
    assert "patches 2x2x2 pixels of 3 channels; position grid 6x6" in run.out
    assert "one token of width 64 per 4 patches (grids in multiples of 4 pixels)" in run.out


def test_node_names_are_paths(checkpoints):
    model = build_qwen_vision(*load_qwen_vision(Checkpoint.open(checkpoints["dense"])))
    paths = [op.get_friendly_name() for op in model.get_ops() if op.get_friendly_name().startswith("visual")]
    assert len(paths) == len(set(paths)), "a path names two nodes"
    names = set(paths)
    for path in ("visual.blocks.1/attn/qkv", "visual.blocks.0/mlp/linear_fc2", "visual.merger/linear_fc1"):
        assert path in names and f"{path}/weight" in names, path


def test_every_tower_is_declared_with_its_reference(checkpoints):
    assert {t.name for t in VISION_TOWERS} == set(VISION_REFERENCES)
    for folder in checkpoints.values():
        ckpt = Checkpoint.open(folder)
        tower = find_vision_tower(ckpt.config, str(ckpt.config_path))
        assert tower is not None and tower.load(ckpt)[0].family == tower.name
    assert find_vision_tower({"architectures": ["Qwen3_5ForCausalLM"]}, "c.json") is None

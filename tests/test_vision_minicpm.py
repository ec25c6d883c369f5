"""The MiniCPM-V 4.7 vision IR (tower, window merger, merger) against the numpy reference written as transformers
computes it, on images of different patch grids packed into one call, in both downsample modes; the config and tensor
errors; the position bucketing the graph computes in integers against transformers' float bucketing."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

from ovbuild.errors import ConfigError, RequestError, TensorError, UnsupportedError
from ovbuild.graph.vision.minicpm import build_minicpm_vision
from ovbuild.graph.weights import WeightPolicy
from ovbuild.ir import VisionIR, core
from ovbuild.ir.ports import IMAGE_EMBEDS, IMAGE_TOKEN_COUNTS, MINICPM_PIXEL_VALUES, MINICPM_TARGET_SIZES
from ovbuild.reference.vision_minicpm import image_features, load_arrays, nearest_position_ids
from ovbuild.testing import F32_NMSE, nmse
from ovbuild.testing.tiny_minicpm_vision import write_tiny_minicpm_vision
from ovbuild.weights.checkpoint import Checkpoint
from ovbuild.weights.vision_minicpm import load_minicpm_vision

# (h, w) patch grids packed into one call: taller than wide, wider than tall, small, and larger than the 16 x 16
# position table (several patches then share a bucket).
SIZES = [(8, 12), (12, 8), (4, 4), (20, 16)]
SIZES_X8 = [(8, 16), (16, 8), (8, 8)]  # two merger rounds in 16x mode need multiples of 8


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("minicpm_vision")
    return {
        "1b": write_tiny_minicpm_vision(root / "1b", "1b"),
        "a3b": write_tiny_minicpm_vision(root / "a3b", "a3b", seed=5),
        "last": write_tiny_minicpm_vision(root / "last", "1b", top={"insert_layer_id": 2}),
        "first": write_tiny_minicpm_vision(
            root / "first", "1b", top={"insert_layer_id": 0}, vision={"hidden_act": "gelu"}
        ),
        "rounds": write_tiny_minicpm_vision(root / "rounds", "1b", top={"merger_times": 2}),
    }


def pixels(cfg, sizes, seed: int = 0) -> np.ndarray:
    """Random patches of `sizes` side by side, as the processor packs them: [1, C, p, L*p]."""
    count = sum(h * w for h, w in sizes)
    return np.random.default_rng(seed).standard_normal((1, cfg.num_channels, cfg.patch_size, count * cfg.patch_size))


def run(model, pixel_values: np.ndarray, sizes) -> tuple[np.ndarray, np.ndarray]:
    compiled = core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    out = compiled({MINICPM_PIXEL_VALUES: pixel_values.astype(np.float32), MINICPM_TARGET_SIZES: np.array(sizes)})
    return out[compiled.output(IMAGE_EMBEDS)], out[compiled.output(IMAGE_TOKEN_COUNTS)]


@pytest.mark.parametrize(
    ("name", "mode", "sizes"),
    [
        ("1b", "16x", SIZES),
        ("1b", "4x", SIZES),
        ("a3b", "16x", SIZES),
        ("last", "16x", SIZES),
        ("first", "16x", SIZES),
        ("rounds", "16x", SIZES_X8),
        ("rounds", "4x", SIZES),
    ],
)
def test_packed_images_match_the_reference(folders, name, mode, sizes):
    ckpt = Checkpoint.open(folders[name])
    cfg, weights = load_minicpm_vision(ckpt, mode)
    pv = pixels(cfg, sizes)
    embeds, counts = run(build_minicpm_vision(cfg, weights), pv, sizes)
    expected = image_features(cfg, load_arrays(weights), pv, np.array(sizes))
    assert counts.tolist() == [len(e) for e in expected] == [cfg.tokens(h, w) for h, w in sizes]
    assert embeds.shape == (sum(counts), cfg.llm_hidden_size)
    err = nmse(embeds, np.concatenate(expected))
    assert err < F32_NMSE, f"{name} {mode}: image embeddings NMSE {err:.2e} (bound {F32_NMSE:.0e})"


def test_each_image_sees_only_itself(folders):
    """An image's tokens are the same packed with others as encoded alone: the mask keeps images apart."""
    cfg, weights = load_minicpm_vision(Checkpoint.open(folders["1b"]))
    model = build_minicpm_vision(cfg, weights)
    pv = pixels(cfg, SIZES, seed=3)
    packed, _ = run(model, pv, SIZES)
    p, start, token = cfg.patch_size, 0, 0
    for h, w in SIZES:
        alone, _ = run(model, pv[..., start * p : (start + h * w) * p], [(h, w)])
        err = nmse(packed[token : token + len(alone)], alone)
        assert err < F32_NMSE, f"image {h}x{w}: packed vs alone NMSE {err:.2e}"
        start, token = start + h * w, token + len(alone)


def test_the_ir_records_how_to_pack_and_count(folders):
    for mode, per_token, multiple in (("16x", 16, 4), ("4x", 4, 2)):
        cfg, weights = load_minicpm_vision(Checkpoint.open(folders["1b"]), mode)
        record = VisionIR.from_model(build_minicpm_vision(cfg, weights))
        assert record == VisionIR("minicpmv4_7_vision", 3, 32, 4, 3, 2, 256, 64, per_token, multiple, None, mode)


@pytest.mark.parametrize("side", [16, 70])
def test_integer_buckets_equal_transformers_float_buckets(side):
    """The graph buckets floor(row * side / h) in integers; transformers bucketizes row / h in float32 against
    arange(1/side, 1, 1/side). They agree for every grid up to 128 x 128 patches (70: 980-pixel table, patch 14)."""
    for h in range(1, 129):
        sizes = np.array([[h, 129 - h]])
        w = 129 - h
        exact = ((np.arange(h) * side // h)[:, None] * side + np.arange(w) * side // w).reshape(-1)
        assert (nearest_position_ids(sizes, side) == exact).all(), (side, h, w)


def edited(folder, tmp_path, **keys):
    """A copy of the checkpoint `folder` whose config.json has `keys` (dotted: vision_config.x) replaced."""
    import shutil

    out = tmp_path / "edited"
    shutil.copytree(folder, out)
    config = json.loads((out / "config.json").read_text())
    for key, value in keys.items():
        section, _, leaf = key.rpartition(".")
        target = config[section] if section else config
        if value is None:
            target.pop(leaf)
        else:
            target[leaf] = value
    (out / "config.json").write_text(json.dumps(config))
    return out


@pytest.mark.parametrize(
    ("keys", "error", "named"),
    [
        ({"downsample_mode": "8x"}, ConfigError, "'downsample_mode'"),
        ({"insert_layer_id": 3}, ConfigError, "'insert_layer_id'"),
        ({"vision_config.hidden_act": "relu"}, UnsupportedError, "'vision_config.hidden_act'"),
        ({"merge_kernel_size": [3, 3]}, UnsupportedError, "'merge_kernel_size'"),
        ({"vision_config.patch_size": [2, 4]}, UnsupportedError, "'vision_config.patch_size'"),
        ({"vision_config.num_attention_heads": 5}, ConfigError, "'vision_config.num_attention_heads'"),
        ({"text_config": None}, ConfigError, "'text_config'"),
    ],
)
def test_bad_config_keys_are_named(folders, tmp_path, keys, error, named):
    with pytest.raises(error, match=named):
        load_minicpm_vision(Checkpoint.open(edited(folders["1b"], tmp_path, **keys)))


def test_a_missing_tensor_is_named(tmp_path):
    gone = "model.vision_tower.vit_merger.linear_1.bias"
    cfg, weights = load_minicpm_vision(Checkpoint.open(write_tiny_minicpm_vision(tmp_path / "m", drop=(gone,))))
    with pytest.raises(TensorError, match=gone):
        build_minicpm_vision(cfg, weights)
    build_minicpm_vision(cfg.with_mode("4x"), weights)  # 4x never reads the window merger


def test_a_misshaped_tensor_is_named(folders, tmp_path):
    """A config that disagrees with the stored tensors: fc1 of the first layer is [48, 32], the config says 40."""
    folder = edited(folders["1b"], tmp_path, **{"vision_config.intermediate_size": 40})
    cfg, weights = load_minicpm_vision(Checkpoint.open(folder))
    with pytest.raises(TensorError, match=r"model\.vision_tower\.encoder\.layers\.0\.mlp\.fc1\.weight"):
        build_minicpm_vision(cfg, weights)


def test_node_names_are_unique_paths_and_int8_stays_close(folders):
    """Every weight goes through the project's weight hook: int8 builds, keeps path names, and stays near f32."""
    cfg, weights = load_minicpm_vision(Checkpoint.open(folders["1b"]))
    model = build_minicpm_vision(cfg, weights, WeightPolicy("int8"))
    names = Counter(n.get_friendly_name() for n in model.get_ops())
    assert not [n for n, c in names.items() if c > 1]
    assert {"vision.vit_merger/linear_1/weight/codes", "merger.mlp.0/linear_2", "vision.layers.2/mlp/fc1"} <= set(names)
    pv = pixels(cfg, SIZES)
    embeds, _ = run(model, pv, SIZES)
    err = nmse(embeds, np.concatenate(image_features(cfg, load_arrays(weights), pv, np.array(SIZES))))
    assert err < 1e-3, f"int8 weights: image embeddings NMSE {err:.2e}"


@pytest.mark.parametrize(
    ("shape", "sizes", "named"),
    [
        ((1, 3, 2, 2 * 96), [(8, 12), (6, 8)], "target_sizes"),  # 6 is not a multiple of 4 (16x)
        ((1, 3, 2, 2 * 95), [(8, 12)], "pixel_values"),  # one patch short
        ((3, 2, 2 * 96), [(8, 12)], "pixel_values"),  # no leading 1
        ((1, 3, 2, 0), [], "target_sizes"),
    ],
)
def test_the_record_refuses_inputs_the_ir_cannot_encode(folders, shape, sizes, named):
    cfg, weights = load_minicpm_vision(Checkpoint.open(folders["1b"]))
    record = VisionIR.from_model(build_minicpm_vision(cfg, weights))
    record.check_inputs((1, 3, 2, 2 * 96), [(8, 12)])
    with pytest.raises(RequestError, match=named) as caught:
        record.check_inputs(shape, sizes)
    assert caught.value.param == named

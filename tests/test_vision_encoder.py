"""The runtime's VisionEncoder on both exported towers (Qwen3.5 family, MiniCPM-V 4.7): one image per IR call,
each image's rows equal to the numpy reference; the content-hash cache (an image encoded once, least recently used
evicted); inputs the IR cannot encode refused by name before any call."""

from __future__ import annotations

import numpy as np
import pytest

from ovbuild.errors import ConfigError, RequestError
from ovbuild.export.api import export
from ovbuild.runtime.vision.encoder import VisionEncoder
from ovbuild.targets import find_vision_tower
from ovbuild.testing import F32_NMSE, nmse
from ovbuild.testing.references import VISION_REFERENCES
from ovbuild.testing.tiny_hybrid import write_tiny_hybrid_target
from ovbuild.testing.tiny_minicpm_vision import write_tiny_minicpm_vision
from ovbuild.weights.checkpoint import Checkpoint

# One image's grid per entry, as each processor gives it: Qwen (t, h, w) in one row; MiniCPM-V (h, w) per crop,
# the second image an overview and two slices.
GRIDS = {
    "qwen": [[[1, 4, 6]], [[2, 8, 4]], [[1, 12, 10]], [[1, 2, 2]]],
    "minicpm": [[[8, 12]], [[4, 4], [8, 8], [8, 8]], [[20, 16]]],
}
WRITERS = {"qwen": write_tiny_hybrid_target, "minicpm": write_tiny_minicpm_vision}


@pytest.fixture(scope="module")
def towers(tmp_path_factory):
    """family -> (checkpoint, exported folder)."""
    root = tmp_path_factory.mktemp("encoder")
    out = {}
    for name, write in WRITERS.items():
        ckpt = write(root / f"{name}_ckpt")
        out[name] = (ckpt, export(ckpt, root / name, weight_format="keep", quiet=True).out)
    return out


def pixels(name: str, record, grid: list[list[int]], seed: int) -> np.ndarray:
    """Random pixel values for one image of `grid`, laid out as the family's processor lays them out."""
    rng, patches, p = np.random.default_rng(seed), int(np.prod(grid, axis=1).sum()), record.patch_size
    if name == "qwen":
        return rng.standard_normal((patches, record.in_channels * record.temporal_patch_size * p * p))
    return rng.standard_normal((1, record.in_channels, p, patches * p))


def images(name: str, encoder: VisionEncoder, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    return [(pixels(name, encoder.record, g, seed + i), np.array(g)) for i, g in enumerate(GRIDS[name])]


def counted(encoder: VisionEncoder) -> list[int]:
    """Wrap the encoder's IR call so that the test counts its calls: returns the list the calls append to."""
    calls, infer = [], encoder.infer

    def wrapper(pixel_values, grid):
        calls.append(len(grid))
        return infer(pixel_values, grid)

    encoder.infer = wrapper
    return calls


@pytest.mark.parametrize("name", list(WRITERS))
def test_each_image_matches_the_reference(towers, name):
    checkpoint, folder = towers[name]
    encoder = VisionEncoder(folder)
    calls = counted(encoder)
    ckpt = Checkpoint.open(checkpoint)
    tower = find_vision_tower(ckpt.config, str(ckpt.config_path))
    reference = VISION_REFERENCES[tower.name](*tower.load(ckpt))
    given = images(name, encoder)
    out = encoder.encode(given)
    assert calls == [len(g) for _, g in given], "one IR call per image"
    expected = [reference.forward(p.astype(np.float32), g) for p, g in given]
    assert [o.shape for o in out] == [e.shape for e in expected]
    assert all(o.dtype == np.float32 and o.shape[1] == encoder.hidden_size for o in out)
    errors = [nmse(o, e) for o, e in zip(out, expected, strict=True)]
    assert max(errors) < F32_NMSE, f"{name}: encoder vs reference, NMSE per image {[f'{e:.2e}' for e in errors]}"


@pytest.mark.parametrize("name", list(WRITERS))
def test_the_same_image_is_encoded_once(towers, name):
    encoder = VisionEncoder(towers[name][1], cache_size=2)
    calls = counted(encoder)
    (a, grid_a), (b, grid_b), (c, grid_c) = images(name, encoder)[:3]
    first = encoder.encode([(a, grid_a)], ["sha-a"])[0]
    again = encoder.encode([(a, grid_a), (b, grid_b)], ["sha-a", "sha-b"])
    assert len(calls) == 2 and again[0] is first, "a cached image is not encoded again"
    assert not first.flags.writeable
    encoder.encode([(c, grid_c)], ["sha-c"])  # evicts sha-a, the least recently used
    encoder.encode([(b, grid_b)], ["sha-b"])
    assert len(calls) == 3
    encoder.encode([(a, grid_a)], ["sha-a"])
    assert len(calls) == 4
    encoder.encode([(a, grid_a), (a, grid_a)])  # no hash: never cached
    assert len(calls) == 6


@pytest.mark.parametrize(
    ("name", "image", "named"),
    [
        ("qwen", (np.zeros((23, 24)), [[1, 4, 6]]), "pixel_values"),  # rows != t * h * w
        ("qwen", (np.zeros((12, 24)), [[1, 3, 4]]), "grid_thw"),  # h not a multiple of the merge size
        ("qwen", (np.zeros((24, 24)), [[4, 6]]), "grid_thw"),  # a MiniCPM-style grid
        ("qwen", (np.zeros((0, 24)), np.zeros((0, 3))), "grid_thw"),  # no image
        ("qwen", (np.zeros((24, 24)), [1, 4, 6]), "grid_thw"),  # not [rows, 3]
        ("minicpm", (np.zeros((1, 3, 2, 2 * 96)), [[8, 12], [6, 8]]), "target_sizes"),  # 6: not a multiple of 4
        ("minicpm", (np.zeros((1, 3, 2, 2 * 95)), [[8, 12]]), "pixel_values"),  # one patch short
        ("minicpm", (np.zeros((1, 3, 2, 2 * 96)), [[1, 8, 12]]), "target_sizes"),  # a Qwen-style grid
    ],
)
def test_inputs_the_ir_cannot_encode_are_refused(towers, name, image, named):
    encoder = VisionEncoder(towers[name][1])
    calls = counted(encoder)
    good = images(name, encoder)[0]
    with pytest.raises(RequestError, match=named) as caught:
        encoder.encode([good, (image[0], np.array(image[1]))])
    assert caught.value.param == named
    assert calls == [], "nothing runs when one image of the call is refused"


def test_a_folder_without_a_tower_is_named(tmp_path):
    with pytest.raises(ConfigError, match=r"no vision tower \(openvino_vision_model\.xml\)"):
        VisionEncoder(tmp_path)
    with pytest.raises(ConfigError, match="unknown device 'NPU9'"):
        VisionEncoder(export(write_tiny_hybrid_target(tmp_path / "c"), tmp_path / "out", quiet=True).out, "NPU9")

"""Checkpoint reading: single file vs shards, bf16 without torch, and a clear error for every malformed input."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from safetensors.numpy import save_file

from ovbuild.errors import CheckpointError, TensorError
from ovbuild.families import load_draft
from ovbuild.testing import write_tiny_dspark, write_tiny_target
from ovbuild.weights.checkpoint import Checkpoint
from ovbuild.weights.dtypes import bf16_to_f32, f32_to_bf16
from ovbuild.weights.safetensors_file import SafetensorsFile, write_safetensors
from ovbuild.weights.tensor import WeightTensor


def test_sharded_and_single_file_give_the_same_tensors(tiny_target, tmp_path):
    sharded = Checkpoint.open(write_tiny_target(tmp_path / "sharded", shards=3))
    single = Checkpoint.open(tiny_target)
    assert len({p for p in sharded._where.values()}) == 3
    assert sorted(sharded.tensor_names) == sorted(single.tensor_names)
    for name in single.tensor_names:
        a, b = sharded.get(name), single.get(name)
        assert a.dtype == b.dtype and np.array_equal(a.array, b.array), name


def test_reader_agrees_with_the_safetensors_package(tmp_path):
    rng = np.random.default_rng(0)
    tensors = {
        "a": rng.standard_normal((3, 5)).astype(np.float32),
        "b": rng.standard_normal(7).astype(np.float16),
        "c": np.arange(6, dtype=np.int64).reshape(2, 3),
    }
    save_file(tensors, str(tmp_path / "x.safetensors"))
    f = SafetensorsFile(tmp_path / "x.safetensors")
    for name, expected in tensors.items():
        got = f.read(name).array
        assert got.dtype == expected.dtype and np.array_equal(got, expected), name


def test_bf16_bits_round_trip_exactly(tmp_path):
    values = np.array([[1.0, -2.5, 0.0, 3.140625], [65280.0, -1e-3, 2.0**-130, 7.0]], np.float32)
    bits = f32_to_bf16(values)
    assert bits[0].tolist() == [0x3F80, 0xC020, 0x0000, 0x4049]
    write_safetensors(tmp_path / "b.safetensors", {"w": WeightTensor("w", "bf16", bits)})
    t = SafetensorsFile(tmp_path / "b.safetensors").read("w")
    assert t.dtype == "bf16" and np.array_equal(t.array, bits)
    # every value that bf16 represents exactly comes back exactly
    assert np.array_equal(t.to_f32()[0], values[0])
    assert np.allclose(bf16_to_f32(bits), values, rtol=2**-8, atol=0)


def test_rounding_is_to_nearest_even():
    # 1 + 2^-8 is halfway between bf16 neighbours 1 and 1 + 2^-7: ties go to the even mantissa (1.0)
    halfway = np.array([1 + 2**-8, 1 + 3 * 2**-8], np.float32)
    assert bf16_to_f32(f32_to_bf16(halfway)).tolist() == [1.0, 1 + 2**-6]


def test_missing_tensor_and_wrong_shape_name_the_tensor(tiny_target):
    ckpt = Checkpoint.open(tiny_target)
    with pytest.raises(TensorError, match=r"'model.layers.9.mlp.up_proj.weight' is missing"):
        ckpt.get("model.layers.9.mlp.up_proj.weight")
    with pytest.raises(TensorError, match=r"'model.norm.weight' has shape \[64\], expected \[65\]"):
        ckpt.get("model.norm.weight", (65,))


def test_weight_source_has_only_the_tensors_its_table_names_and_the_checkpoint_holds(draft, tmp_path):
    """`has` answers for any name (a DFlash draft borrows embed_tokens: its table has no row for it); `get` of a
    name outside the table is an error naming it."""
    dcfg, weights = draft
    assert weights.has("fc") and weights.has("layers.0.mlp.up_proj")
    assert not weights.has(f"layers.{dcfg.num_layers}.mlp.up_proj") and not weights.has("embed_tokens")
    own = load_draft(Checkpoint.open(write_tiny_dspark(tmp_path / "dspark")))[1]
    assert own.has("embed_tokens") and own.has("lm_head")
    with pytest.raises(TensorError, match="no tensor 'embed_tokens' in this architecture's name table"):
        weights.get("embed_tokens")


def test_truncated_file_is_reported(tiny_target, tmp_path):
    folder = tmp_path / "trunc"
    shutil.copytree(tiny_target, folder)
    path = folder / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 100])
    with pytest.raises(CheckpointError, match=r"model.safetensors: truncated safetensors file"):
        Checkpoint.open(folder)
    path.write_bytes(data[:5])
    with pytest.raises(CheckpointError, match="truncated safetensors file"):
        Checkpoint.open(folder)


def test_shard_missing_from_index_is_reported(tmp_path):
    folder = write_tiny_target(tmp_path / "sharded", shards=2)
    (folder / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(
        CheckpointError, match=r"shard 'model-00002-of-00002.safetensors' listed in the index is missing"
    ):
        Checkpoint.open(folder)


def test_index_that_disagrees_with_a_shard_is_reported(tmp_path):
    folder = write_tiny_target(tmp_path / "sharded", shards=2)
    index_path = folder / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    moved = "model.norm.weight"
    index["weight_map"][moved] = "model-00001-of-00002.safetensors"
    index_path.write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=f"'{moved}' is listed in model.safetensors.index.json but not stored"):
        Checkpoint.open(folder)


def test_pickle_checkpoint_is_refused_without_unpickling(tmp_path):
    folder = tmp_path / "pickled"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "pytorch_model.bin").write_bytes(b"\x80\x04not really a pickle")
    with pytest.raises(CheckpointError, match=r"pytorch_model.bin.*reads safetensors only and never unpickles"):
        Checkpoint.open(folder)


def test_missing_folder_and_missing_config(tmp_path):
    with pytest.raises(CheckpointError, match="no such checkpoint folder"):
        Checkpoint.open(tmp_path / "nope" / "deeper")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match=r"empty/config.json: file not found"):
        Checkpoint.open(tmp_path / "empty")

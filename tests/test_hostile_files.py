"""Hostile checkpoints: safetensors headers and shard indexes crafted to break the reader, and symlinks leading out
of the checkpoint folder. Each is refused with an ovbuild error naming the file (and tensor); a fuzz test mutates
headers and indexes thousands of times and every case ends in an ovbuild error or a correct read."""

from __future__ import annotations

import json
import os
import random
import shutil
import struct

import numpy as np
import pytest

from ovbuild.errors import OvbuildError
from ovbuild.weights.checkpoint import INDEX_FILE, Checkpoint
from ovbuild.weights.dtypes import SAFETENSORS_DTYPES
from ovbuild.weights.safetensors_file import SafetensorsFile

from export_helpers import assert_clean_error, ovbuild, snapshot


def safetensors_bytes(header: object, data: bytes = b"") -> bytes:
    blob = json.dumps(header).encode() if not isinstance(header, bytes) else header
    return struct.pack("<Q", len(blob)) + blob + data


def entry(dtype="F32", shape=(2,), offsets=(0, 8)) -> dict:
    return {"dtype": dtype, "shape": list(shape), "data_offsets": list(offsets)}


# (id, header, data, message): each written as the target's model.safetensors and exported.
HEADERS = [
    ("dims whose product overflows int64", {"w": entry(shape=[2**32, 2**32], offsets=[0, 0])}, b"",
     "tensor 'w' has shape [4294967296, 4294967296]: more elements than int64 counts"),
    ("huge dims next to a zero", {"w": entry(shape=[2**32, 2**32, 0], offsets=[0, 0])}, b"",
     "tensor 'w' has shape [4294967296, 4294967296, 0]: more elements than int64 counts"),
    ("dims that do not match the offsets", {"w": entry(shape=[3], offsets=[0, 8])}, bytes(8),
     "tensor 'w' offsets [0, 8) do not match shape [3] of F32"),
    ("negative dims", {"w": entry(shape=[-2, -1], offsets=[0, 8])}, bytes(8),
     "tensor 'w' has shape [-2, -1]: dims must be integers >= 0"),
    ("fractional dim", {"w": entry(shape=[2.0], offsets=[0, 8])}, bytes(8),
     "tensor 'w' has shape [2.0]: dims must be integers >= 0"),
    ("dims as strings", {"w": entry(shape=["2"], offsets=[0, 8])}, bytes(8),
     "tensor 'w' has shape ['2']: dims must be integers >= 0"),
    ("negative offsets", {"w": entry(offsets=[-8, 0])}, bytes(8),
     "tensor 'w' has data_offsets [-8, 0]: expected [begin, end], integers >= 0"),
    ("fractional offsets", {"w": entry(offsets=[0, 8.0])}, bytes(8),
     "tensor 'w' has data_offsets [0, 8.0]: expected [begin, end], integers >= 0"),
    ("three offsets", {"w": entry(offsets=[0, 8, 16])}, bytes(16),
     "tensor 'w' has data_offsets [0, 8, 16]: expected [begin, end], integers >= 0"),
    ("dtype that is a list", {"w": entry(dtype=["F32"])}, bytes(8), "tensor 'w' has unsupported dtype ['F32']"),
    ("dtype that is a number", {"w": entry(dtype=7)}, bytes(8), "tensor 'w' has unsupported dtype 7"),
    ("overlapping tensors", {"a": entry(offsets=[0, 8]), "b": entry(shape=[3], offsets=[4, 16])}, bytes(16),
     "tensors 'a' and 'b' overlap in the data section"),
    ("entry that is not an object", {"w": "F32"}, b"",
     "malformed header entry for tensor 'w' (needs dtype, shape, data_offsets)"),
    ("header that is a list", [1, 2], b"", "safetensors header is not a JSON object"),
    ("deeply nested header", b"[" * 100_000 + b"]" * 100_000, b"", "not a readable safetensors file"),
    ("integer of 5000 digits", b'{"w": {"dtype": "F32", "shape": [' + b"9" * 5000 + b'], "data_offsets": [0, 8]}}',
     bytes(8), "not a readable safetensors file"),
    ("name with a line break", {"w\nx": entry(dtype="Q8")}, bytes(8), "tensor 'w\\nx' has unsupported dtype 'Q8'"),
]  # fmt: skip


@pytest.mark.parametrize("header, data, message", [c[1:] for c in HEADERS], ids=[c[0] for c in HEADERS])
def test_hostile_header_is_one_clear_line(tmp_path, capsys, tiny_target, header, data, message):
    folder = tmp_path / "ckpt"
    shutil.copytree(tiny_target, folder)
    (folder / "model.safetensors").write_bytes(safetensors_bytes(header, data))
    before = snapshot(tmp_path)
    run = ovbuild(capsys, "export", "-m", folder, tmp_path / "out")
    assert_clean_error(run, f"ckpt/model.safetensors: {message}")
    assert snapshot(tmp_path) == before


def sharded(tmp_path):
    """A copy of the tiny target in two shards, plus a valid shard outside it (what a hostile index points at)."""
    from ovbuild.testing import write_tiny_target

    folder = write_tiny_target(tmp_path / "ckpt", shards=2)
    shutil.copy(folder / "model-00002-of-00002.safetensors", tmp_path / "outside.safetensors")
    return folder


def remap(folder, shard: object) -> None:
    """Map model.norm.weight (which lives in shard 2) to `shard` in the index."""
    index = json.loads((folder / INDEX_FILE).read_text())
    index["weight_map"]["model.norm.weight"] = shard
    (folder / INDEX_FILE).write_text(json.dumps(index))


def symlink_out(folder, name="model-00002-of-00002.safetensors"):
    (folder / name).unlink()
    (folder / name).symlink_to(folder.parent / "outside.safetensors")
    return name


def not_in_folder(shard):
    return f"tensor 'model.norm.weight' is mapped to {shard!r}, which is not a file name in the checkpoint folder"


INDEXES = [
    ("parent folder", lambda f: "../outside.safetensors", not_in_folder("../outside.safetensors")),
    ("absolute path", lambda f: str(f.parent / "outside.safetensors"), "which is not a file name in the checkpoint"),
    ("/etc/passwd", lambda f: "../../../../../../etc/passwd", "which is not a file name in the checkpoint folder"),
    ("subfolder", lambda f: "sub/x.safetensors", not_in_folder("sub/x.safetensors")),
    ("number", lambda f: 2, not_in_folder(2)),
    ("null", lambda f: None, not_in_folder(None)),
    ("list", lambda f: ["model-00002-of-00002.safetensors"], not_in_folder(["model-00002-of-00002.safetensors"])),
    ("empty name", lambda f: "", not_in_folder("")),
    ("symlink leading outside", symlink_out, "model-00002-of-00002.safetensors: a symlink leading outside the "
     "checkpoint folder"),
    ("folder named like a shard", lambda f: (f / "0.safetensors").mkdir() or "0.safetensors",
     "0.safetensors: not a regular file"),
    ("named pipe", lambda f: os.mkfifo(f / "0.safetensors") or "0.safetensors", "0.safetensors: not a regular file"),
]  # fmt: skip


@pytest.mark.parametrize("setup, message", [c[1:] for c in INDEXES], ids=[c[0] for c in INDEXES])
def test_hostile_shard_index_is_one_clear_line(tmp_path, capsys, setup, message):
    folder = sharded(tmp_path)
    remap(folder, setup(folder))
    before = snapshot(tmp_path)
    run = ovbuild(capsys, "export", "-m", folder, tmp_path / "out")
    assert_clean_error(run, message)
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("name", ["config.json", "generation_config.json", "tokenizer_config.json", "tokenizer.json"])
def test_files_symlinked_from_outside_are_not_read_or_copied(tmp_path, capsys, tiny_target, name):
    folder = tmp_path / "ckpt"
    shutil.copytree(tiny_target, folder)
    secret = tmp_path / "secret.json"
    (folder / name).rename(secret)  # still a valid file: only where it lives is wrong
    (folder / name).symlink_to(secret)
    before = snapshot(tmp_path)
    run = ovbuild(capsys, "export", "-m", folder, tmp_path / "out")
    assert_clean_error(run, f"ckpt/{name}: a symlink leading outside the checkpoint folder (to {secret})")
    assert snapshot(tmp_path) == before


def test_symlinks_inside_the_folder_and_a_hub_cache_snapshot_are_fine(tmp_path, capsys, tiny_target):
    """Symlinks that stay inside are followed; a Hugging Face cache snapshot is all symlinks into ../../blobs."""
    repo = tmp_path / "models--org--tiny"
    snapshot_dir = repo / "snapshots" / "0123abc"
    (repo / "blobs").mkdir(parents=True)
    snapshot_dir.mkdir(parents=True)
    for i, file in enumerate(sorted(tiny_target.iterdir())):
        blob = repo / "blobs" / f"blob{i}"
        shutil.copy(file, blob)
        (snapshot_dir / file.name).symlink_to(os.path.relpath(blob, snapshot_dir))
    run = ovbuild(capsys, "export", "-m", snapshot_dir, tmp_path / "out", "-q")
    assert run.code == 0, run.err
    assert (tmp_path / "out" / "tokenizer.json").read_bytes() == (tiny_target / "tokenizer.json").read_bytes()
    assert not (tmp_path / "out" / "tokenizer.json").is_symlink()


# ------------------------------------------------------------------------------------------------------------- fuzz
HOSTILE = [-1, 0, 1, 3, 8, 2**31, 2**32, 2**63, 2**64 + 8, -(2**63), 10**30, 1.5, 8.0, float("inf"), float("nan"),
           "8", "", True, False, None, [], [0], [0, 8], [8, 0], [1, 2, 3], {}, {"a": 1}, "F32", "BF16", "I8", "Q4",
           ["F32"], "../x", "/etc/passwd"]  # fmt: skip
DTYPES = ["F32", "F16", "I64", "U8"]


def base_file(rng: np.random.Generator) -> tuple[dict, bytes]:
    """A valid header of four tensors (one empty) and its data section."""
    header, data = {"__metadata__": {"format": "pt"}}, b""
    for i, (dtype, shape) in enumerate(zip(DTYPES, [(2, 3), (5,), (0, 4), (3, 1, 2)], strict=True)):
        array = rng.integers(0, 100, shape).astype(SAFETENSORS_DTYPES[dtype][1])
        header[f"t{i}"] = entry(dtype, shape, (len(data), len(data) + array.nbytes))
        data += array.tobytes()
    return header, data


def mutate_header(r: random.Random, header: dict) -> object:
    """One or two structural changes: a field, a dim or an offset replaced, offsets shifted or shared, dims that
    overflow int64, keys dropped."""
    header = json.loads(json.dumps(header))
    for _ in range(r.choice([1, 1, 2])):
        name = r.choice([n for n in header if n != "__metadata__"] or ["t0"])
        e = header.get(name)
        kind = r.randrange(9)
        if kind == 0 or not isinstance(e, dict):
            header[name] = r.choice(HOSTILE)
        elif kind == 1:
            e[r.choice(["dtype", "shape", "data_offsets"])] = r.choice(HOSTILE)
        elif kind == 2 and isinstance(e.get("shape"), list) and e["shape"]:
            e["shape"][r.randrange(len(e["shape"]))] = r.choice(HOSTILE)
        elif kind == 3 and isinstance(e.get("data_offsets"), list) and e["data_offsets"]:
            e["data_offsets"][r.randrange(len(e["data_offsets"]))] = r.choice(HOSTILE)
        elif kind == 4 and isinstance(e.get("data_offsets"), list):
            shift = r.choice([-8, -1, 1, 4, 8, 1000])
            e["data_offsets"] = [o + shift if type(o) is int else o for o in e["data_offsets"]]
        elif kind == 5:
            other = header[r.choice([n for n in header if n != "__metadata__"])]
            if isinstance(other, dict):
                e["data_offsets"] = other.get("data_offsets")
        elif kind == 6:
            e["shape"] = r.choice([[2**32, 2**32], [2**62, 4], [2**63, 2], [-1, -8], [2**32, 2**32, 0]])
        elif kind == 7:
            e.pop(r.choice(["dtype", "shape", "data_offsets"]), None)
        else:
            e["dtype"] = r.choice([*DTYPES, "BF16", "BOOL", "I8"])
    return header


def mutate_bytes(r: random.Random, raw: bytes) -> bytes:
    """A flipped byte in the header, a wrong header length, or a truncated or extended file."""
    kind = r.randrange(4)
    raw = bytearray(raw)
    if kind == 0:
        raw[r.randrange(8, len(raw))] = r.randrange(256)
    elif kind == 1:
        raw[:8] = struct.pack(
            "<Q", r.choice([0, 1, 2**63, len(raw), struct.unpack("<Q", raw[:8])[0] + r.choice([-1, 1])])
        )
    elif kind == 2:
        raw = raw[: r.randrange(len(raw))]
    else:
        raw += bytes(r.randrange(1, 64))
    return bytes(raw)


def check_read(path, raw: bytes) -> None:
    """The file was accepted: every tensor reads back as declared, with the bytes its header entry points at
    (header parsed here on its own; data offsets are relative to the end of the header)."""
    read = SafetensorsFile(path)
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + length])
    data = raw[8 + length :]
    assert set(read.tensors) == set(header) - {"__metadata__"}
    for name in read.tensors:
        e = header[name]
        array = read.read(name).array
        assert array.shape == tuple(e["shape"]) and array.dtype == SAFETENSORS_DTYPES[e["dtype"]][1], name
        assert array.tobytes() == data[e["data_offsets"][0] : e["data_offsets"][1]], name


def test_fuzzed_headers_end_in_an_ovbuild_error_or_a_correct_read(tmp_path):
    r, rng = random.Random(15), np.random.default_rng(15)
    header, data = base_file(rng)
    outcomes = {"error": 0, "read": 0}
    for case in range(3000):
        raw = safetensors_bytes(mutate_header(r, header), data)
        if case % 3 == 0:
            raw = mutate_bytes(r, raw)
        path = tmp_path / f"{case % 50}.safetensors"
        path.unlink(missing_ok=True)  # a new file: an earlier case's mapping stays valid, and no flush
        path.write_bytes(raw)
        try:
            check_read(path, raw)
            outcomes["read"] += 1
        except OvbuildError:
            outcomes["error"] += 1
    print(f"3000 fuzzed headers: {outcomes}")
    assert outcomes["read"] > 100 and outcomes["error"] > 1000, outcomes  # both outcomes well exercised


def mutate_index(r: random.Random, index: dict, shards: list[str]) -> object:
    index = json.loads(json.dumps(index))
    weight_map = index["weight_map"]
    names = sorted(weight_map)
    kind = r.randrange(8)
    if kind == 0:
        weight_map[r.choice(names)] = r.choice(HOSTILE)
    elif kind == 1:
        weight_map[r.choice(names)] = r.choice(shards)  # a tensor moved to the other shard
    elif kind == 2:
        weight_map[r.choice(names)] = r.choice(
            ["link-in.safetensors", "link-out.safetensors", "folder.safetensors", "config.json", INDEX_FILE,
             "missing.safetensors", "../outside.safetensors", "./" + shards[0], shards[0] + "\0", "."]
        )  # fmt: skip
    elif kind == 3:
        del weight_map[r.choice(names)]
    elif kind == 4:
        weight_map[f"extra.{r.randrange(9)}"] = r.choice(shards)
    elif kind == 5:
        index["weight_map"] = r.choice(HOSTILE)
    elif kind == 6:
        return r.choice(HOSTILE)
    else:  # the same shard through a symlink that stays inside: must read the same tensors
        for name in names:
            if weight_map[name] == shards[0]:
                weight_map[name] = "link-in.safetensors"
    return index


def test_fuzzed_shard_indexes_end_in_an_ovbuild_error_or_a_correct_read(tmp_path):
    from ovbuild.testing import write_tiny_target

    folder = write_tiny_target(tmp_path / "ckpt", shards=2, num_hidden_layers=1, layer_types=["full_attention"])
    index = json.loads((folder / INDEX_FILE).read_text())
    shards = sorted(set(index["weight_map"].values()))
    expected = {n: Checkpoint(folder).get(n).array.copy() for n in index["weight_map"]}
    shutil.copy(folder / shards[1], tmp_path / "outside.safetensors")
    (folder / "link-in.safetensors").symlink_to(shards[0])
    (folder / "link-out.safetensors").symlink_to(tmp_path / "outside.safetensors")
    (folder / "folder.safetensors").mkdir()
    r = random.Random(15)
    outcomes = {"error": 0, "read": 0}
    for _ in range(1000):
        text = json.dumps(mutate_index(r, index, shards))
        if r.random() < 0.2:
            at = r.randrange(len(text))
            text = text[:at] + r.choice(['"', "}", "\\", "é", "", "0"]) + text[at + 1 :]
        (folder / INDEX_FILE).unlink()  # a new file, not a truncated one: ext4 flushes on truncation
        (folder / INDEX_FILE).write_text(text)
        try:
            ckpt = Checkpoint(folder)
        except OvbuildError:
            outcomes["error"] += 1
            continue
        outcomes["read"] += 1
        assert set(ckpt.tensor_names) == set(expected)
        for name in ckpt.tensor_names:
            assert ckpt._where[name].resolve().parent == folder.resolve(), name
            assert np.array_equal(ckpt.get(name).array, expected[name]), name
    print(f"1000 fuzzed shard indexes: {outcomes}")
    assert outcomes["read"] > 50 and outcomes["error"] > 500, outcomes


def test_fuzzed_checkpoints_export_or_fail_in_one_line(tmp_path, capsys, tiny_target):
    """A handful of whole exports of the tiny target with a mutated model.safetensors header."""
    raw = (tiny_target / "model.safetensors").read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header, data = json.loads(raw[8 : 8 + length]), raw[8 + length :]
    r = random.Random(15)
    codes = []
    for case in range(6):
        folder = tmp_path / f"ckpt{case}"
        shutil.copytree(tiny_target, folder)
        mutated = mutate_header(r, header) if case else header  # case 0: the unmutated file, a correct export
        (folder / "model.safetensors").write_bytes(safetensors_bytes(mutated, data))
        before, out = snapshot(tmp_path), tmp_path / f"out{case}"
        run = ovbuild(capsys, "export", "-m", folder, out, "-q")
        codes.append(run.code)
        if run.code == 0:
            assert run.err == "" and {"openvino_model.xml", "openvino_model.bin"} <= set(os.listdir(out)), run.err
        else:
            assert_clean_error(run, f"ckpt{case}")
            assert snapshot(tmp_path) == before
    assert codes[0] == 0 and 2 in codes, codes

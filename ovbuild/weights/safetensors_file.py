"""Lazy, memory-mapped safetensors reading (and writing, for tiny test checkpoints), bf16 included, no torch.

The format: 8-byte little-endian header length, a JSON header {name: {dtype, shape, data_offsets}}, then the data.
We parse it ourselves because numpy has no bf16 and we want one tensor at a time straight from the page cache.
"""

from __future__ import annotations

import json
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ovbuild.errors import CheckpointError
from ovbuild.weights.dtypes import DTYPE_CODES, SAFETENSORS_DTYPES
from ovbuild.weights.tensor import WeightTensor

_MAX_HEADER = 100 * 1024 * 1024


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lives inside a safetensors file."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int  # absolute byte offset in the file
    end: int


class SafetensorsFile:
    """One .safetensors file: header parsed and checked on open, tensors mapped on demand."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._mmap: mmap.mmap | None = None
        self.tensors = _read_header(self.path)

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def read(self, name: str) -> WeightTensor:
        """Return tensor `name` as a read-only view of the mapped file (no copy)."""
        info = self.tensors[name]
        if self._mmap is None:
            with open(self.path, "rb") as f:
                self._mmap = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        np_dtype = SAFETENSORS_DTYPES[DTYPE_CODES[info.dtype]][1]
        count = int(np.prod(info.shape, dtype=np.int64))
        array = np.frombuffer(self._mmap, dtype=np_dtype, count=count, offset=info.begin).reshape(info.shape)
        return WeightTensor(name, info.dtype, array)

    def release(self, name: str) -> None:
        """Unmap the resident pages of tensor `name` (MADV_DONTNEED): a file-backed page is re-read on next access,
        so views stay valid, but a build no longer accumulates the whole checkpoint in its resident set."""
        if self._mmap is None:
            return
        info = self.tensors[name]
        begin = info.begin - info.begin % mmap.PAGESIZE
        if info.end > begin:
            self._mmap.madvise(mmap.MADV_DONTNEED, begin, info.end - begin)


def _read_header(path: Path) -> dict[str, TensorInfo]:
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            raw_len = f.read(8)
            if len(raw_len) < 8:
                raise CheckpointError(f"{path}: truncated safetensors file ({size} bytes, no header)")
            (header_len,) = struct.unpack("<Q", raw_len)
            if header_len > min(_MAX_HEADER, size - 8):
                raise CheckpointError(
                    f"{path}: truncated or corrupt safetensors file (header of {header_len} bytes "
                    f"in a {size}-byte file)"
                )
            header = json.loads(f.read(header_len))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: not a readable safetensors file ({e})") from e
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: safetensors header is not a JSON object")
    data_start = 8 + header_len
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        tensors[name] = _tensor_info(path, name, entry, data_start, size)
    return tensors


def _tensor_info(path: Path, name: str, entry: dict, data_start: int, size: int) -> TensorInfo:
    try:
        code, shape, (begin, end) = entry["dtype"], tuple(int(d) for d in entry["shape"]), entry["data_offsets"]
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"{path}: malformed header entry for tensor '{name}'") from e
    if code not in SAFETENSORS_DTYPES:
        raise CheckpointError(f"{path}: tensor '{name}' has unsupported dtype {code}")
    itemsize = SAFETENSORS_DTYPES[code][1].itemsize
    if end - begin != int(np.prod(shape, dtype=np.int64)) * itemsize or begin < 0:
        raise CheckpointError(
            f"{path}: tensor '{name}' offsets [{begin}, {end}) do not match shape {list(shape)} of {code}"
        )
    if data_start + end > size:
        raise CheckpointError(
            f"{path}: truncated safetensors file: tensor '{name}' needs bytes up to "
            f"{data_start + end} but the file has {size}"
        )
    return TensorInfo(name, SAFETENSORS_DTYPES[code][0], shape, data_start + begin, data_start + end)


def write_safetensors(path: str | Path, tensors: dict[str, WeightTensor], metadata: dict[str, str] | None = None):
    """Write tensors (bf16 given as uint16 bits) as a safetensors file, in the given order, 8-byte aligned header."""
    header: dict = {"__metadata__": metadata or {"format": "pt"}}
    offset = 0
    for name, t in tensors.items():
        nbytes = t.array.nbytes
        header[name] = {
            "dtype": DTYPE_CODES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for t in tensors.values():
            f.write(np.ascontiguousarray(t.array).tobytes())

"""Lazy, memory-mapped safetensors reading (and writing, for tiny test checkpoints), bf16 included, no torch.

The format: 8-byte little-endian header length, a JSON header {name: {dtype, shape, data_offsets}}, then the data.
We parse it ourselves because numpy has no bf16 and we want one tensor at a time straight from the page cache.
"""

from __future__ import annotations

import itertools
import json
import math
import mmap
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ovbuild.errors import CheckpointError
from ovbuild.weights.dtypes import DTYPE_CODES, SAFETENSORS_DTYPES
from ovbuild.weights.tensor import WeightTensor

_MAX_HEADER = 100 * 1024 * 1024
_MAX_ELEMENTS = 2**63 - 1


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
        count = math.prod(info.shape)
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
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):
            raise CheckpointError(f"{path}: not a regular file")
        size = info.st_size
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
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:  # ValueError: JSON, huge integers
        raise CheckpointError(f"{path}: not a readable safetensors file ({_reason(e)})") from e
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: safetensors header is not a JSON object")
    data_start = 8 + header_len
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        tensors[name] = _tensor_info(path, name, entry, data_start, size)
    _check_disjoint(path, tensors.values())
    return tensors


def _tensor_info(path: Path, name: str, entry: object, data_start: int, size: int) -> TensorInfo:
    """One header entry, checked: a known dtype, non-negative integer dims and offsets that match them."""
    if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= entry.keys():
        raise CheckpointError(f"{path}: malformed header entry for tensor '{name}' (needs dtype, shape, data_offsets)")
    code, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not isinstance(code, str) or code not in SAFETENSORS_DTYPES:
        raise CheckpointError(f"{path}: tensor '{name}' has unsupported dtype {_short(code)}")
    if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
        raise CheckpointError(f"{path}: tensor '{name}' has shape {_short(shape)}: dims must be integers >= 0")
    if math.prod(d for d in shape if d) > _MAX_ELEMENTS:  # even with a zero dim: numpy cannot shape it
        raise CheckpointError(f"{path}: tensor '{name}' has shape {_short(shape)}: more elements than int64 counts")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_count(o) for o in offsets):
        raise CheckpointError(
            f"{path}: tensor '{name}' has data_offsets {_short(offsets)}: expected [begin, end], integers >= 0"
        )
    begin, end = offsets
    # Python integers: a product of dims that overflows int64 stays exact and simply does not match.
    nbytes = math.prod(shape) * SAFETENSORS_DTYPES[code][1].itemsize
    if end - begin != nbytes:
        raise CheckpointError(f"{path}: tensor '{name}' offsets [{begin}, {end}) do not match shape {shape} of {code}")
    if data_start + end > size:
        raise CheckpointError(
            f"{path}: truncated safetensors file: tensor '{name}' needs bytes up to "
            f"{data_start + end} but the file has {size}"
        )
    return TensorInfo(name, SAFETENSORS_DTYPES[code][0], tuple(shape), data_start + begin, data_start + end)


def _check_disjoint(path: Path, tensors) -> None:
    """No two tensors share bytes (writing one in place would change the other; a crafted file may alias)."""
    ranges = sorted((t.begin, t.end, t.name) for t in tensors if t.end > t.begin)
    for (_, end, first), (begin, _, second) in itertools.pairwise(ranges):
        if begin < end:
            raise CheckpointError(f"{path}: tensors '{first}' and '{second}' overlap in the data section")


def _is_count(value: object) -> bool:
    return type(value) is int and value >= 0  # not bool, not float


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _reason(e: Exception) -> str:
    text = e.strerror if isinstance(e, OSError) and e.strerror else str(e) or type(e).__name__
    return text if len(text) <= 80 else text[:77] + "..."


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

"""Reference weights: every tensor read with the `safetensors` package and widened to float64 once.

The builders read checkpoints with ovbuild's own reader (ovbuild.weights.safetensors_file); the reference must not
share it, or a reader bug (a bf16 decode, a transposed tensor) would reach both sides of a parity test unseen. Only
the family's name table (canonical name -> checkpoint name, plain data) is shared. Tiny checkpoints only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import safetensors
from safetensors import safe_open

from ovbuild.reference.layers import REF_DTYPE

if TYPE_CHECKING:
    from ovbuild.weights.config import Backbone
    from ovbuild.weights.tensor_names import WeightSource


class ReferenceWeights:
    """A checkpoint folder's config.json and tensors by canonical name, independent of ovbuild's reader."""

    def __init__(self, source: WeightSource):
        self.names = source  # only its name table is used: canonical -> checkpoint name
        self.folder = Path(source.checkpoint.folder)
        self.config = json.loads((self.folder / "config.json").read_text(encoding="utf-8"))
        self._files: dict[str, Path] = {}
        self._bf16: dict[Path, dict] = {}  # raw entries of a file holding bf16 tensors, parsed once
        for path in sorted(self.folder.glob("*.safetensors")):
            with safe_open(path, framework="np") as f:
                self._files.update(dict.fromkeys(f.keys(), path))

    def has(self, canonical: str) -> bool:
        name = self.names.lookup(canonical)
        return name is not None and name in self._files

    def get(self, canonical: str, shape: tuple[int, ...]) -> np.ndarray:
        """Tensor `canonical` as float64, shape-checked."""
        name = self.names.checkpoint_name(canonical)
        path = self._files[name]
        with safe_open(path, framework="np") as f:
            dtype = f.get_slice(name).get_dtype()
            array = f.get_tensor(name) if dtype != "BF16" else None
        if array is None:  # numpy has no bf16: decode the stored bytes here
            if path not in self._bf16:
                self._bf16[path] = dict(safetensors.deserialize(path.read_bytes()))
            array = _bf16_values(self._bf16[path][name])
        if array.shape != tuple(shape):
            raise ValueError(f"{path}: tensor '{name}' has shape {array.shape}, the reference expects {shape}")
        return array.astype(REF_DTYPE)


def _bf16_values(entry: dict) -> np.ndarray:
    """bf16 is the upper half of a float32: little-endian bytes [lo, hi] become the float32 bytes [0, 0, lo, hi]."""
    pairs = np.frombuffer(bytes(entry["data"]), np.uint8).reshape(-1, 2)
    words = np.zeros((len(pairs), 4), np.uint8)
    words[:, 2:] = pairs
    return words.view("<f4").reshape(entry["shape"])


def reference_weights(source: WeightSource | ReferenceWeights) -> ReferenceWeights:
    """The reference's view of a weight source (a ReferenceWeights, e.g. one that rounds weights, passes as is)."""
    return source if isinstance(source, ReferenceWeights) else ReferenceWeights(source)


def load(weights: ReferenceWeights, name: str, shape: tuple[int, ...]) -> np.ndarray:
    """Canonical tensor `name` as a float64 array, shape-checked."""
    return weights.get(name, shape)


@dataclass
class LayerWeights:
    """One Qwen3-style decoder layer (attention + SwiGLU MLP)."""

    input_layernorm: np.ndarray
    q_proj: np.ndarray
    k_proj: np.ndarray
    v_proj: np.ndarray
    o_proj: np.ndarray
    q_norm: np.ndarray
    k_norm: np.ndarray
    post_attention_layernorm: np.ndarray
    gate_proj: np.ndarray
    up_proj: np.ndarray
    down_proj: np.ndarray

    @classmethod
    def load(cls, weights: ReferenceWeights, cfg: Backbone, i: int) -> LayerWeights:
        h, q, kv, inter, d = cfg.hidden_size, cfg.q_size, cfg.kv_size, cfg.intermediate_size, cfg.head_dim
        shapes = {
            "input_layernorm": (h,),
            "self_attn.q_proj": (q, h),
            "self_attn.k_proj": (kv, h),
            "self_attn.v_proj": (kv, h),
            "self_attn.o_proj": (h, q),
            "self_attn.q_norm": (d,),
            "self_attn.k_norm": (d,),
            "post_attention_layernorm": (h,),
            "mlp.gate_proj": (inter, h),
            "mlp.up_proj": (inter, h),
            "mlp.down_proj": (h, inter),
        }
        return cls(**{n.split(".")[-1]: load(weights, f"layers.{i}.{n}", s) for n, s in shapes.items()})

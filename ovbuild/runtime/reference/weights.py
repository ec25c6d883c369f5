"""Loading reference weights: every tensor widened to float64 once (reference models are for tiny checkpoints)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ovbuild.runtime.reference.layers import REF_DTYPE
from ovbuild.weights.config import Backbone
from ovbuild.weights.tensor_names import WeightSource


def load(source: WeightSource, name: str, shape: tuple[int, ...]) -> np.ndarray:
    """Canonical tensor `name` as a float64 array, shape-checked."""
    return source.get(name, shape).to_f32().astype(REF_DTYPE)


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
    def load(cls, source: WeightSource, cfg: Backbone, i: int) -> LayerWeights:
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
        return cls(**{n.split(".")[-1]: load(source, f"layers.{i}.{n}", s) for n, s in shapes.items()})

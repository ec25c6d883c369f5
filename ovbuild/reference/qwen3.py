"""Numpy reference of the Qwen3 target: prefill and incremental decode with a KV cache, logits and layer taps."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ovbuild.reference.layers import (
    REF_DTYPE,
    attention,
    linear,
    rms_norm,
    rope,
    swiglu_mlp,
    visibility,
)
from ovbuild.reference.rope import rope_from_config
from ovbuild.reference.weights import LayerWeights, ReferenceWeights, load, reference_weights
from ovbuild.weights.target import TargetConfig

if TYPE_CHECKING:
    from ovbuild.weights.tensor_names import WeightSource


@dataclass
class KVCache:
    """Per-layer keys and values (after k_norm and RoPE) of every token seen so far."""

    keys: list[np.ndarray] = field(default_factory=list)  # per layer [length, kv_heads, head_dim]
    values: list[np.ndarray] = field(default_factory=list)

    @property
    def length(self) -> int:
        return self.keys[0].shape[0] if self.keys else 0

    def truncate(self, length: int) -> None:
        """Forget everything from position `length` on (rejected speculative tokens)."""
        self.keys = [k[:length] for k in self.keys]
        self.values = [v[:length] for v in self.values]


def new_cache(num_layers: int, kv_heads: int, head_dim: int) -> KVCache:
    empty = np.zeros((0, kv_heads, head_dim), REF_DTYPE)
    return KVCache([empty] * num_layers, [empty] * num_layers)


class Qwen3Reference:
    """The target, one sequence at a time. `forward` appends tokens to the cache and returns logits and taps."""

    def __init__(self, cfg: TargetConfig, source: WeightSource | ReferenceWeights):
        self.cfg = cfg
        h, v = cfg.hidden_size, cfg.vocab_size
        weights = reference_weights(source)
        # RoPE and eps from config.json itself, not from the parsed config the builders use
        self.rope = rope_from_config(weights.config, cfg.head_dim)
        self.eps = float(weights.config.get("rms_norm_eps", 1e-6))
        self.embed = load(weights, "embed_tokens", (v, h))
        self.layers = [LayerWeights.load(weights, cfg, i) for i in range(cfg.num_layers)]
        self.norm = load(weights, "norm", (h,))
        self.lm_head = load(weights, "lm_head", (v, h))

    def new_cache(self) -> KVCache:
        return new_cache(self.cfg.num_layers, self.cfg.num_kv_heads, self.cfg.head_dim)

    def forward(
        self, cache: KVCache, token_ids: np.ndarray, tap_layer_ids: tuple[int, ...] = ()
    ) -> tuple[np.ndarray, np.ndarray]:
        """Run `token_ids` [n] after the cached ones: logits [n, V] and taps [n, len(taps) * H]."""
        positions = cache.length + np.arange(len(token_ids))
        x = self.embed[np.asarray(token_ids)]
        outputs = []
        for i, w in enumerate(self.layers):
            x = self._layer(i, w, x, positions, cache)
            outputs.append(x)
        h = rms_norm(x, self.norm, self.eps)
        # transformers returns the last layer's output after the final norm; taps of that layer see the same.
        outputs[-1] = h
        taps = (
            np.concatenate([outputs[t] for t in tap_layer_ids], -1)
            if tap_layer_ids
            else np.zeros((len(token_ids), 0), REF_DTYPE)
        )
        return linear(h, self.lm_head), taps

    def _layer(self, i: int, w: LayerWeights, x: np.ndarray, positions: np.ndarray, cache: KVCache) -> np.ndarray:
        cfg = self.cfg
        n, d = x.shape[0], cfg.head_dim
        u = rms_norm(x, w.input_layernorm, self.eps)
        q = rms_norm(linear(u, w.q_proj).reshape(n, cfg.num_heads, d), w.q_norm, self.eps)  # [n, H, D]
        k = rms_norm(linear(u, w.k_proj).reshape(n, cfg.num_kv_heads, d), w.k_norm, self.eps)  # [n, KV, D]
        v = linear(u, w.v_proj).reshape(n, cfg.num_kv_heads, d)  # [n, KV, D]
        q, k = rope(q, positions, self.rope), rope(k, positions, self.rope)
        cache.keys[i] = np.concatenate([cache.keys[i], k])
        cache.values[i] = np.concatenate([cache.values[i], v])
        mask = visibility(positions, np.arange(cache.keys[i].shape[0]), window=cfg.sliding_windows[i])
        x = x + linear(attention(q, cache.keys[i], cache.values[i], mask), w.o_proj)
        return x + swiglu_mlp(rms_norm(x, w.post_attention_layernorm, self.eps), w.gate_proj, w.up_proj, w.down_proj)
